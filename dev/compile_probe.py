"""What the static decoder step costs on this CPU, run three ways: one teacher decoder step at batch 1
(``nat_plugins/engine/static_cache.py``: 2 layers, the output projection and an argmax) on a random source of 20
subwords, the greedy loop fed its own argmax for 30 steps, ms per call:

* eager: the step's layers run op by op from Python (``NAT_TRACED_STEP=0``);
* traced: the plugin's default on the CPU, a TorchScript trace of the layers per (batch size, new tokens);
* compiled: the same step under ``torch.compile(dynamic=False)`` (inductor; ``--cpp-wrapper``: its C++ wrapper),
  after a first compiling pass.

    python dev/compile_probe.py CHECKPOINT DATA_BIN [--cpp-wrapper] [--threads 2]

Every way must emit the same tokens (printed). The compiled step needs a C++ compiler (inductor's CPU backend).
"""

import argparse
import os
import time

import torch
import torch._inductor.config as inductor_config
from fairseq import checkpoint_utils

from nat_plugins import engine
from nat_plugins.engine.config import TRACED_STEP_ENV
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

        def step(token, slot):
            return decoder.output_projection(cache.step(token, slot, slot))[:, -1].argmax(-1)

        def loop(step_fn):
            token, tokens = torch.tensor([[decoder.dictionary.eos()]]), []
            start = time.perf_counter()
            for t in range(STEPS):
                token = step_fn(token, torch.tensor([[t]])).view(1, 1)
                tokens.append(int(token))
            return 1000 * (time.perf_counter() - start) / STEPS, tokens

        def best_of(step_fn):
            return min(loop(step_fn) for _ in range(REPEATS))

        traced_ms, reference = best_of(step)
        os.environ[TRACED_STEP_ENV] = "0"
        eager_ms, eager_tokens = best_of(step)
        compiled = torch.compile(step, dynamic=False)
        start = time.perf_counter()
        loop(compiled)
        compile_s = time.perf_counter() - start
        compiled_ms, compiled_tokens = best_of(compiled)
    print(f"torch {torch.__version__}, {args.threads} threads, cpp_wrapper={args.cpp_wrapper}")
    print(f"traced step: {traced_ms:.3f} ms a call")
    print(f"eager step: {eager_ms:.3f} ms a call, same tokens: {eager_tokens == reference}")
    print(
        f"compiled step: {compiled_ms:.3f} ms a call (first pass {compile_s:.1f} s), same tokens: "
        f"{compiled_tokens == reference}"
    )


if __name__ == "__main__":
    main()
