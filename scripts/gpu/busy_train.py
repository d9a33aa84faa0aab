#!/usr/bin/env python3
"""A deterministic PyTorch training loop that keeps training while the tool acts (issue 27).

A small GPT-2-like decoder (token and position embeddings, pre-LayerNorm blocks of causal
self-attention and an MLP, a head tied to the token embedding; about 70M parameters by default),
built from torch.nn with a fixed seed: no downloads. Random token data from a seeded CPU generator,
AdamW, fp32 (TF32 off), torch.use_deterministic_algorithms(True) and
CUBLAS_WORKSPACE_CONFIG=:4096:8, so two runs on the same GPU give bit-identical losses. Attention
is written out (matmul, mask, softmax) rather than taken from scaled_dot_product_attention, whose
fused backward kernels are not all deterministic; see build_model for the embedding and the loss.

Every step's loss goes to --losses as one line: "STEP LOSS-AS-FLOAT.HEX", flushed at once (the lane
counts the lines to see how far it got).

Two ways to run it:
  reference  no --ready-dir: exactly --steps steps, then the summary line (the lane runs this
             without the shim: the run left alone).
  busy       --ready-dir D: ready.json once the first step is done, then training goes on until at
             least --steps steps are done AND D/stop exists (--max-seconds bounds it); steps past
             --steps are trained and written too. With --reference FILE each step's loss is compared,
             bit for bit, with that run's as soon as it is computed (a difference is a failed check)
             and the summary says whether all of the first min(--steps, reference) were identical.
Each step also checks that its loss is finite.

Output: one JSON summary line on stdout ({"summary": true, "ok", "iterations", "failures",
"first_failure", "bit_identical", "compared", "step_ms_median", "longest_iteration_ms", ...}), and a
"ready" line once working. Exit 0 only if every check passed, 1 otherwise, 2 on bad arguments.
"""

import argparse
import math
import os
import statistics
import sys
import time

# Multicast off (lane_common) before torch is imported; cuBLAS's workspace fixed for determinism.
import lane_common  # noqa: F401 (multicast off at module level, in spawned children too)
from busy_common import Tally, add_common_args, emit, guarded, shim_mapped, stop_requested, write_ready

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def build_model(torch, vocab, seq, d_model, layers, heads):
    """The decoder, on the CPU (the caller moves it), parameters drawn from the global seed.

    Only matmuls, elementwise operations and plain reductions, all deterministic on CUDA: the
    token embedding is a matmul with one-hot rows and the loss a masked log-softmax, because the
    backward passes of nn.Embedding and nll_loss may accumulate with atomics (PyTorch lists
    NLLLoss among the operations that throw under use_deterministic_algorithms)."""
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d_model)
            self.qkv = nn.Linear(d_model, 3 * d_model)
            self.proj = nn.Linear(d_model, d_model)
            self.ln2 = nn.LayerNorm(d_model)
            self.fc = nn.Linear(d_model, 4 * d_model)
            self.out = nn.Linear(4 * d_model, d_model)
            mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), diagonal=1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q, k, v = (y.view(b, t, heads, c // heads).transpose(1, 2) for y in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            att = att.masked_fill(self.mask[:t, :t], float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            x = x + self.proj(y)
            return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Parameter(torch.randn(vocab, d_model) * 0.02)
            self.pos = nn.Parameter(torch.randn(seq, d_model) * 0.01)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d_model)

        def forward(self, onehot):
            """Logits for one-hot input rows (batch, time, vocab)."""
            x = onehot @ self.tok + self.pos[: onehot.shape[1]]
            for block in self.blocks:
                x = block(x)
            return self.ln(x) @ self.tok.T  # head tied to the token embedding

    return Decoder()


def one_hot(torch, tokens, vocab):
    """float32 one-hot rows, made by comparison (no scatter)."""
    return (tokens.unsqueeze(-1) == torch.arange(vocab, device=tokens.device)).to(torch.float32)


def read_reference(path):
    """{step: hex string} of a reference losses file."""
    losses = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                losses[int(parts[0])] = parts[1]
    return losses


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=150, help="steps that must be done (default 150)")
    parser.add_argument("--losses", required=True, help="file for every step's loss (float.hex)")
    parser.add_argument("--reference", help="losses file of a run left alone, to compare with")
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=12)
    add_common_args(parser, stall_default=120.0, ready_required=False)  # without --ready-dir: the reference run
    args = parser.parse_args()
    if args.steps < 1 or args.d_model % args.heads:
        parser.error("--steps must be >= 1 and --d-model a multiple of --heads")
    return args


def main():
    args = parse_args()
    pid = os.getpid()
    tally = Tally("train", "trainer", args.stall_timeout)
    if args.require_shim and not shim_mapped():
        tally.fail({"error": "libcuinterpose.so not mapped"})
        emit(tally.summary())
        return 1
    reference = {}
    if args.reference:
        try:
            reference = read_reference(args.reference)
        except OSError as e:
            tally.fail({"error": "reference %s: %s" % (args.reference, e)})
            emit(tally.summary())
            return 1

    import torch

    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(args.seed)
    device = torch.device("cuda", 0)
    model = build_model(torch, args.vocab, args.seq, args.d_model, args.layers, args.heads).to(device)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.Generator().manual_seed(args.seed + 1)  # CPU: the same tokens on any GPU
    compared = identical = 0
    step_times = []
    losses_file = open(args.losses, "w")

    def step(n):
        nonlocal compared, identical
        t0 = time.monotonic()
        tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=data).to(device)
        logits = model(one_hot(torch, tokens[:, :-1], args.vocab))
        target = one_hot(torch, tokens[:, 1:], args.vocab)
        loss = -(logits.log_softmax(dim=-1) * target).sum(dim=-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        value = float(loss.item())  # waits for the step's kernels
        losses_file.write("%d %s\n" % (n, value.hex()))
        losses_file.flush()
        tally.check(math.isfinite(value), {"error": "loss not finite", "step": n, "loss": value.hex()})
        if n in reference and n < args.steps:
            compared += 1
            same = reference[n] == value.hex()
            identical += same
            tally.check(same, {"error": "loss differs from the reference", "step": n,
                               "loss": value.hex(), "reference": reference[n]})
        step_times.append(time.monotonic() - t0)
        tally.tick()

    try:
        step(0)
        tally.start_watchdog()
        if args.ready_dir:
            write_ready(args.ready_dir, {"pids": [pid], "pid": pid, "workload": "train"})
            emit(dict(phase="ready", ok=True, pid=pid, params=params, shim=shim_mapped()))
        deadline = time.monotonic() + args.max_seconds
        n = 1
        while n < args.steps or (args.ready_dir and not stop_requested(args.ready_dir)):
            if time.monotonic() > deadline:
                tally.fail({"error": "not done within --max-seconds %.0f" % args.max_seconds, "step": n})
                break
            step(n)
            n += 1
    except Exception as e:  # any error is a failed run, reported, not a traceback alone
        tally.fail({"error": "%s: %s" % (type(e).__name__, e)})
    tally.finish()
    losses_file.close()
    expected = min(args.steps, len(reference)) if args.reference else 0
    if args.reference and compared < expected:
        tally.fail({"error": "compared %d steps of %d" % (compared, expected)})
    record = tally.summary(
        params=params, steps=args.steps, losses=args.losses, reference=args.reference,
        compared=compared, bit_identical=(compared == expected and identical == compared) if args.reference else None,
        step_ms_median=round(statistics.median(step_times) * 1000.0, 1) if step_times else None,
        torch=torch.__version__, batch=args.batch, seq=args.seq)
    emit(record)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(guarded("train", main))
