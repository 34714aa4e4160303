"""One folder per system (the key the catalogue, ``SYSTEMS=`` and the recipes use): its model, its loss(es), its
decoding and the blocks only it uses; importing a folder registers its model and criterions with fairseq. What
several systems share lives below them: ``modules`` (building blocks, the model mixin), ``generators`` (the generator
base and the verify-accept loop) and the decoding ``engine``."""

from . import blockwise, fertility_nat, nad_ad, recover_sat, sat, spec_drafter  # noqa: F401  (registration)
