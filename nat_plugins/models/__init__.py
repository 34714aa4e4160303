"""Plugin models, one file per system (registered with fairseq on import)."""
