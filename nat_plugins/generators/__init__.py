"""Decoding algorithms, one file per system's generator, and the option check they share."""

# fairseq generation options the plugin decoders do not implement, with their "off" values
UNSUPPORTED_OPTIONS = {
    "sampling": False, "match_source_len": False, "no_repeat_ngram_size": 0, "diverse_beam_groups": -1,
    "diversity_rate": -1.0, "prefix_size": 0, "constraints": None, "lm_path": None, "print_alignment": None,
}


def check_generation_options(models, gen_args, decoder_name):
    """A clear error for an ensemble (``--path a:b``) or a fairseq generation option ``decoder_name`` lacks."""
    if len(models) != 1:
        raise ValueError(f"{decoder_name} decodes one model, got an ensemble of {len(models)} (--path)")
    for name, off in UNSUPPORTED_OPTIONS.items():
        if getattr(gen_args, name, off) not in (off, None):
            raise ValueError(f"--{name.replace('_', '-')} is not supported by {decoder_name}")
