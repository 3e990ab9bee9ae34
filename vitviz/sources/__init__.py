"""Where models come from: names (:mod:`.names`, parsed once), timm, Hugging Face, torchvision, checkpoints, declared
sizes, the bundled model, class labels, and the loader that builds one (:mod:`.models`)."""
