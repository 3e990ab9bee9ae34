"""Counts on screen in plain words: one thing in the singular, with the verb that agrees, in every sentence a page
builds from a count."""
from ui.words import counted, part_of, subject


def test_counts_and_their_verbs_agree_with_one_and_with_two():
    assert counted(1, "image") == "1 image" and counted(2, "image") == "2 images"
    assert counted(1, "patch") == "1 patch" and counted(2, "patch") == "2 patches"
    assert subject(1, "image", ("gives", "give")) == "1 image gives"
    assert subject(2, "image", ("gives", "give")) == "2 images give"
    assert part_of(1, 3, "image") == "1 of 3 images has" and part_of(2, 3, "image") == "2 of 3 images have"
    assert part_of(1, 1, "image") == "1 of 1 image has"


def test_the_probes_sentences_count_images_and_groups_in_words():
    from ui.probes import accuracy_caption, accuracy_title

    assert accuracy_title(1, 1, "cls") == "Linear-probe accuracy per layer · 1 image, 1 group · cls pooling"
    assert accuracy_title(4, 2, "cls") == "Linear-probe accuracy per layer · 4 images, 2 groups · cls pooling"
    assert accuracy_caption("M", 0.5, "cls", 1).endswith("With few images the intervals are wide: 1 image gives a "
                                                         "step of 100% per image.")
    assert accuracy_caption("M", 0.5, "cls", 2).endswith("2 images give a step of 50% per image.")


def test_queries_keys_and_features_sentences_count_in_words():
    from types import SimpleNamespace

    from ui.features import extra_label, firing_sentence, training_caption
    from ui.queries_keys import ablation_title, heading_text

    assert heading_text(SimpleNamespace(images=[0])) == "1 image"
    assert heading_text(SimpleNamespace(images=list(range(12)))) == "8 images"  # the first MAX_IMAGES
    assert ablation_title("zero", True, 1).endswith("change of the top-1 logit, mean over 1 image")
    assert ablation_title("mean", False, 2) == ("Each head set to its image-set mean alone: 1 − cosine(pooled after, "
                                                "before), mean over 2 images")
    assert firing_sentence("Patch 3", 1).startswith("**Patch 3**: 1 latent fires there, strongest first.")
    assert firing_sentence("Patch 3", 2).startswith("**Patch 3**: 2 latents fire there,")
    assert training_caption(2, 1, 1, None).startswith("Trains on 2 images (the sidebar's 1 and 1 sample photo); ")
    assert training_caption(1, 1, 0, None).startswith("Trains on 1 image (the sidebar's 1); ")
    assert extra_label(1) == "Also the other bundled sample photo"
    assert extra_label(3) == "Also the 3 other bundled sample photos"


def test_the_painted_concepts_title_counts_patches_in_words():
    from ui.concepts_page import accuracy_title, painted_line

    assert accuracy_title(1, 1).endswith("· 1 concept patch and 1 not-concept patch")
    assert accuracy_title(24, 2).endswith("· 24 concept patches and 2 not-concept patches")
    assert painted_line("a.jpg", 24, 0) == "- a.jpg: 24 concept patches, 0 not-concept patches"
    assert painted_line("a.jpg", 1, 1) == "- a.jpg: 1 concept patch, 1 not-concept patch"
    assert painted_line("a.jpg", 0, 0) == "- a.jpg: 0 concept patches, 0 not-concept patches (maps only)"


def test_a_file_size_reads_as_the_uploader_writes_it():
    from vitviz.words import file_size

    assert file_size(1) == "1 byte" and file_size(999) == "999 bytes"
    assert file_size(46_021) == "46.0 KB"  # a photo of 46 KB was "0.0 MB" in the sidebar's list
    assert file_size(999_949) == "999.9 KB" and file_size(999_950) == "1.0 MB"  # never "1000.0 KB"
    assert file_size(2_540_000) == "2.5 MB" and file_size(3_210_000_000) == "3.2 GB"
