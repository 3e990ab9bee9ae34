"""The analyses: arrays in, arrays out, each taking a token layout — rollout, flow, distance, maps, tokens, position
embeddings, filters, clusters, anatomy, per-head statistics over image sets, comparisons of models."""
