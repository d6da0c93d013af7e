"""Train the tiny byte-level language model behind the 4-bit KV quality check (issue 14, T10).

Run once; it writes tests/data/kvquality/tinylm.npz (fp16 weights, the held-out evaluation
text and the training log), which tests/unit/kvcompress/test_kv_quality.py loads without
torch. Deterministic for a seed on one machine (CPU, one thread).

    PYTHONPATH=src .venv/bin/python scripts/train_kv_quality_model.py [--steps 1500]

The model: byte vocabulary (256), learned positions (256), 2 pre-norm blocks (RMSNorm,
4-head causal attention without biases, SiLU MLP 2x), a final RMSNorm and a tied output.
The corpus: docs/*.md of this repository; the last 12 KB of architecture.md are held out.
The forward here and the numpy one in the test must stay the same function.
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np
import torch
from torch import nn

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "kvquality" / "tinylm.npz"
D, HEADS, LAYERS, FF, MAX_LEN, EPS = 128, 4, 2, 256, 256, 1e-5
HELD_OUT = 12_000


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n1 = nn.Parameter(torch.ones(D))
        self.qkv = nn.Linear(D, 3 * D, bias=False)
        self.o = nn.Linear(D, D, bias=False)
        self.n2 = nn.Parameter(torch.ones(D))
        self.up = nn.Linear(D, FF, bias=False)
        self.down = nn.Linear(FF, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(rms(x, self.n1)).split(D, dim=-1)
        q, k, v = (a.view(b, t, HEADS, D // HEADS).transpose(1, 2) for a in (q, k, v))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, D))
        return x + self.down(torch.nn.functional.silu(self.up(rms(x, self.n2))))


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, D)
        self.pos = nn.Embedding(MAX_LEN, D)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.nf = nn.Parameter(torch.ones(D))
        for e in (self.emb, self.pos):
            nn.init.normal_(e.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1]))
        for blk in self.blocks:
            x = blk(x)
        return rms(x, self.nf) @ self.emb.weight.T


def corpus() -> tuple[bytes, bytes]:
    docs = sorted((ROOT / "docs").glob("*.md"))
    held = (ROOT / "docs" / "architecture.md").read_bytes()[-HELD_OUT:]
    train = b"\n".join(p.read_bytes() for p in docs if p.name != "architecture.md")
    train += (ROOT / "docs" / "architecture.md").read_bytes()[:-HELD_OUT]
    return train, held


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    train, held = corpus()
    data = torch.tensor(list(train), dtype=torch.long)
    model = TinyLM()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=args.steps)
    gen = torch.Generator().manual_seed(args.seed)
    t0, log = time.time(), []
    ctx = 160
    for step in range(args.steps):
        starts = torch.randint(0, len(data) - ctx - 1, (16,), generator=gen)
        xb = torch.stack([data[s:s + ctx] for s in starts])
        yb = torch.stack([data[s + 1:s + ctx + 1] for s in starts])
        loss = nn.functional.cross_entropy(model(xb).reshape(-1, 256), yb.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 100 == 0 or step == args.steps - 1:
            log.append((step, loss.item()))
            print(f"step {step} loss {loss.item():.3f} ({time.time() - t0:.0f} s)", flush=True)
    with torch.no_grad():
        h = torch.tensor(list(held[:4096]), dtype=torch.long)[: 25 * ctx].view(-1, ctx)
        val = float(nn.functional.cross_entropy(model(h[:, :-1]).reshape(-1, 256),
                                                h[:, 1:].reshape(-1)))
    print(f"held-out loss {val:.3f} nats/byte (perplexity {np.exp(val):.2f})")
    arrays = {k: v.detach().numpy().astype(np.float16) for k, v in model.state_dict().items()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **arrays, held_out=np.frombuffer(held, dtype=np.uint8),
                        train_log=np.array(log, dtype=np.float32),
                        held_out_loss=np.float32(val))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
