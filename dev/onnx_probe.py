"""What ONNX Runtime gains on the fertility NAT at batch 1 on this CPU: ms per sentence through the generator
(``task.inference_step``, as fairseq-generate decodes a batch), PyTorch eager against ``--onnx-model`` float32 and int8
(nat_plugins/systems/fertility_nat/onnx_decoding.py), and the pass alone (encoder + fertility predictor + decoder:
PyTorch eager against the two ONNX Runtime sessions).

A random fertility_nat of the CPU preset's size (run_scripts/common.sh CPU_MODEL_SIZE: 2+2 layers, 256-d, FFN 1024,
4 heads, shared embeddings) over a VOCAB-word dictionary (default 8,000, the Multi30k quickstart's sentencepiece size);
its fertility predictor is biased to fertility 1, so a source of LENGTH subwords + EOS decodes LENGTH target positions.
The three ways run each sentence in turn (rotating which goes first), after WARMUP sentences; medians and means.

    python dev/onnx_probe.py [--sentences 200] [--threads 1] [--length 16] [--vocab 8000] [--json OUT]

Prints the CPU model, the tokens agreeing with PyTorch (float32 must agree up to near-ties; int8 is another precision).
"""

import argparse
import copy
import json
import platform
import statistics
import tempfile
import time
from argparse import Namespace

import torch
from fairseq import options
from fairseq.data import Dictionary

import nat_plugins  # noqa: F401  (registers the plugin's models and task)
from nat_plugins.cli import export_onnx
from nat_plugins.engine.cpu_linear import cpu_model
from nat_plugins.tasks.translation_nat import TranslationNATConfig, TranslationNATTask

CPU_MODEL_SIZE = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256 "
    "--encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 "
    "--decoder-attention-heads 4 --share-all-embeddings"
).split()
WAYS = ("pytorch", "onnx float32", "onnx int8")


def random_nat(vocab: int):
    dictionary = Dictionary()
    for i in range(vocab - dictionary.nspecial):
        dictionary.add_symbol(f"w{i}")
    task = TranslationNATTask(TranslationNATConfig(), dictionary, dictionary)
    argv = ["unused", "--task", "translation_nat", "--arch", "fertility_nat", "--max-fertility", "50"] + CPU_MODEL_SIZE
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    torch.manual_seed(0)
    model = task.build_model(args).eval()
    with torch.no_grad():
        model.fertility_predictor.out.bias[1] += 30.0  # fertility 1 everywhere: T = source length
    return task, model


def generators(task, model, directories):
    """The three generators, as the task builds them (the PyTorch one's linear layers in the engine's layout)."""
    gen_args = Namespace(beam=1, max_len_a=1.2, max_len_b=10)
    built = {}
    for way, directory in zip(WAYS, (None,) + directories):
        copied = copy.copy(task)
        copied.cfg = copy.deepcopy(task.cfg)
        copied.cfg.onnx_model = directory
        built[way] = (copied, copied.build_generator([model], gen_args))
    return built


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--length", type=int, default=16, help="source subwords (EOS added)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task, model = random_nat(args.vocab)
    dictionary = task.source_dictionary
    with tempfile.TemporaryDirectory() as scratch:
        float_dir, int8_dir = f"{scratch}/float32", f"{scratch}/int8"
        export_onnx.write_graphs(model, float_dir)
        export_onnx.write_graphs(model, int8_dir, int8=True)
        built = generators(task, model, (float_dir, int8_dir))
        generator = torch.Generator().manual_seed(1)
        seconds = {way: [] for way in WAYS}
        passes = {"pytorch pass": [], "onnx float32 pass": [], "onnx int8 pass": []}
        agree = {way: 0 for way in WAYS}
        positions = 0
        for n in range(args.warmup + args.sentences):
            words = torch.randint(dictionary.nspecial, len(dictionary), (1, args.length), generator=generator)
            src_tokens = torch.cat([words, torch.tensor([[dictionary.eos()]])], dim=1)
            sample = {"net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor([args.length + 1])}}
            order = WAYS[n % 3 :] + WAYS[: n % 3]
            outputs = {}
            for way in order:
                task_k, gen = built[way]
                start = time.perf_counter()
                outputs[way] = task_k.inference_step(gen, [model], sample)[0][0]["tokens"]
                elapsed = time.perf_counter() - start
                if n >= args.warmup:
                    seconds[way].append(elapsed)
                    passes[f"{way} pass"].append(pass_seconds(way, gen, model, sample))
            if n >= args.warmup:
                reference = outputs["pytorch"]
                positions += reference.numel()
                for way in WAYS:
                    same = outputs[way].numel() == reference.numel()
                    agree[way] += int((outputs[way] == reference).sum()) if same else 0
    result = {
        "cpu": cpu_model(),
        "machine": platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "sentences": args.sentences,
        "source_length": args.length,
        "vocab": args.vocab,
        "ms_per_sentence_median": {way: 1000 * statistics.median(s) for way, s in seconds.items()},
        "ms_per_sentence_mean": {way: 1000 * statistics.fmean(s) for way, s in seconds.items()},
        "ms_per_pass_median": {way: 1000 * statistics.median(s) for way, s in passes.items()},
        "tokens_agreeing_with_pytorch": {way: agree[way] / positions for way in WAYS},
    }
    import onnxruntime

    result["onnxruntime"] = onnxruntime.__version__
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


def pass_seconds(way, gen, model, sample):
    """Seconds of the pass alone: PyTorch's encoder, fertility log-probabilities and decoder (argmax fertilities), or
    the two ONNX Runtime sessions on the same inputs."""
    src_tokens = sample["net_input"]["src_tokens"]
    with torch.no_grad():
        if way == "pytorch":
            start = time.perf_counter()
            encoder_out = model.encode(src_tokens, sample["net_input"]["src_lengths"])
            lprobs = model.get_normalized_probs((model.fertility_logits(encoder_out), None), log_probs=True)
            fertility = lprobs.argmax(-1).masked_fill(~model.copyable(src_tokens), 0)
            model.decode(src_tokens, encoder_out, fertility)
            return time.perf_counter() - start
        runner = gen.onnx
        start = time.perf_counter()
        encoder_out, padding, lprobs, inputs = runner.encoder.run(None, {"src_tokens": src_tokens.numpy()})
        fertility = torch.from_numpy(lprobs).argmax(-1).masked_fill(~model.copyable(src_tokens), 0)
        index = torch.arange(int(fertility.sum())).unsqueeze(0)
        runner.decoder.run(
            None,
            {
                "inputs": inputs[:, : index.size(1)],
                "padding_mask": torch.zeros(index.shape, dtype=torch.bool).numpy(),
                "encoder_out": encoder_out,
                "encoder_padding_mask": padding,
                "unk_penalty": torch.tensor(0.0).numpy(),
            },
        )
        return time.perf_counter() - start


if __name__ == "__main__":
    main()
