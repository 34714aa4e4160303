"""Does ``torch.compile`` make the static decoder step cheaper on this CPU? One teacher decoder step at batch 1
(``nat_plugins/engine/static_cache.py``: 2 layers, the output projection and an argmax) on a random source of 20
subwords, the greedy loop fed its own argmax for 30 steps, ms per call:

* eager: the plugin's step (``StaticCache.step``, attention over the slots used so far);
* compiled: the same step over every slot of the buffers under an additive mask (one static shape for every step),
  ``torch.compile(dynamic=False)`` (inductor; ``--cpp-wrapper``: its C++ wrapper), after a first compiling pass;
* full-width eager: that full-width step without compiling (what the mask costs).

    python dev/compile_probe.py CHECKPOINT DATA_BIN [--cpp-wrapper] [--threads 2]

Every way must emit the same tokens (printed). The compiled step needs a C++ compiler (inductor's CPU backend).
"""

import argparse
import time

import torch
import torch._inductor.config as inductor_config
import torch.nn.functional as F
from fairseq import checkpoint_utils

from nat_plugins import engine
from nat_plugins.engine.block_call import layer_inputs, layer_outputs
from nat_plugins.engine.static_cache import StaticCache

STEPS, LENGTH, REPEATS = 30, 40, 5


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("data_bin")
    parser.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper (fewer Python calls)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    inductor_config.cpp_wrapper = args.cpp_wrapper
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task(
        [args.checkpoint], arg_overrides={"data": args.data_bin}
    )
    model = engine.prepare_for_decoding(models[0].eval())
    decoder = model.decoder
    torch.manual_seed(0)
    source = torch.randint(4, len(decoder.dictionary), (1, 20))
    source[0, -1] = decoder.dictionary.eos()
    with torch.no_grad():
        cache = StaticCache(decoder, model.encoder(source, src_lengths=torch.tensor([20])), LENGTH)

        def eager(token, position, slot, step):
            return decoder.output_projection(cache.step(token, position, slot, step + 1))[:, -1].argmax(-1)

        def full_width(token, position, slot, bias):
            x = layer_inputs(decoder, decoder.embed_scale * decoder.embed_tokens(token), position)
            x = layer_outputs(decoder, cache.run(x, slot, LENGTH, bias))
            return F.linear(x[:, -1], decoder.output_projection.weight).argmax(-1)

        def loop(step_fn, masked):
            token, tokens = torch.tensor([[decoder.dictionary.eos()]]), []
            start = time.perf_counter()
            for step in range(STEPS):
                position, slot = torch.tensor([[step]]), torch.tensor([[step]])
                if masked:
                    bias = torch.full((1, 1, 1, LENGTH), float("-inf"))
                    bias[..., : step + 1] = 0
                    token = step_fn(token, position, slot, bias).view(1, 1)
                else:
                    token = step_fn(token, position, slot, step).view(1, 1)
                tokens.append(int(token))
            return 1000 * (time.perf_counter() - start) / STEPS, tokens

        def best_of(step_fn, masked):
            return min(loop(step_fn, masked) for _ in range(REPEATS))

        eager_ms, reference = best_of(eager, False)
        compiled = torch.compile(full_width, dynamic=False)
        start = time.perf_counter()
        loop(compiled, True)
        compile_s = time.perf_counter() - start
        compiled_ms, compiled_tokens = best_of(compiled, True)
        full_ms, full_tokens = best_of(full_width, True)
    print(f"torch {torch.__version__}, {args.threads} threads, cpp_wrapper={args.cpp_wrapper}")
    print(f"eager step: {eager_ms:.3f} ms a call")
    print(
        f"compiled full-width step: {compiled_ms:.3f} ms a call (first pass {compile_s:.1f} s), same tokens: "
        f"{compiled_tokens == reference}"
    )
    print(f"full-width eager step: {full_ms:.3f} ms a call, same tokens: {full_tokens == reference}")


if __name__ == "__main__":
    main()
