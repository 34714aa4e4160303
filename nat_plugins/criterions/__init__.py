"""Training objectives, one file per criterion (registered with fairseq on import)."""
