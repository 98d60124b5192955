"""The study behind ``--calibrator auto`` (issue 21): every STS set scored alone, fitted on its own sentences.

Three steps, each re-runnable (2-core VM, CPU, float32, max_length 64):

    # 1. token states of every distinct STS sentence (layer 1 and L, token ids): ~18 min per encoder on 2 cores
    python benchmarks/auto_rule.py dump --model ../shared/models/bert-gutenberg-L6-H384 --name raw --cache runs/auto
    python benchmarks/auto_rule.py dump --model sentence-transformers/all-MiniLM-L6-v2 --name minilm --cache runs/auto
    # 2. per set (26: each STS12-16 subset, STS-B, SICK-R) and size (all sentences, 300, 100), and per task (the
    #    7-task "target" regime): raw and calibrated cosines of every candidate setting, each weighting
    python benchmarks/auto_rule.py cases --name raw --cache runs/auto --weightings none,sif_own,sif_gut,sif_mix
    python benchmarks/auto_rule.py cases --name minilm --cache runs/auto --weightings none,sif_own,sif_gut
    # 3. leave-one-dataset-out choice of the rule's settings, per-set tables (mean, worst, count below raw - 2)
    python benchmarks/auto_rule.py report --cache runs/auto --output docs/results/auto_rule

Why token states: a weighted pooling's vectors depend on the token statistics of each fitting set (and each
sample), so pooling is redone per set from the cached states (a weighted mean of rows) instead of re-encoding.
``dump`` checks its poolings against ``SentenceEncoder.encode`` on a sample, and ``cases`` checks its fast
candidate (numpy) against the library's ``AutoCalibrator`` on one set, so the study measures the product.
Candidates: a weighting (none; SIF a=1e-3 with the set's own counts, the generic Gutenberg prior of
``bertflow.encoding.token_prior``, or both; uSIF / IDF through the library's ``Weighting``), a whitening
strength alpha in {0, 0.5, 0.75, 1} and a calibrated-cosine weight beta (1, the anisotropy ``a``, and ``a``
times a reliability factor of N and D). No label is used to *fit* anything; labels only score.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from bertflow.calibrators.auto import AutoCalibrator  # noqa: E402
from bertflow.encoding.token_prior import available_priors  # noqa: E402
from bertflow.evaluation.datasets import load_sts_tasks  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "sts"
SIZES = ("full", 300, 100)
ALPHAS = (0.0, 0.5, 0.75, 1.0)


# -- 1. token states --------------------------------------------------------------------------------------------


def distinct_sentences(tasks) -> list[str]:
    return list(dict.fromkeys(s for t in tasks.values() for pairs in t.splits.values() for s in pairs.sentences()))


def dump(args: argparse.Namespace) -> None:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from bertflow.encoding.encoder import SentenceEncoder

    torch.set_num_threads(2)
    sents = distinct_sentences(load_sts_tasks(data_dir=args.data))
    encoder = SentenceEncoder(args.model, pooling="first-last-avg", max_length=64, device="cpu")
    path = encoder.source_dir or args.model
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()
    ids = tok(sents, truncation=True, max_length=64)["input_ids"]
    lens = np.array([len(x) for x in ids])
    off = np.concatenate([[0], np.cumsum(lens)])
    h1 = np.zeros((off[-1], model.config.hidden_size), np.float16)
    hl = np.zeros_like(h1)
    layers = model.config.num_hidden_layers
    order = np.argsort(lens, kind="stable")
    with torch.inference_mode():
        for b in range(0, len(order), 128):
            rows = order[b : b + 128]
            batch = tok.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")
            out = model(**batch, output_hidden_states=True)
            for j, i in enumerate(rows):
                h1[off[i] : off[i] + lens[i]] = out.hidden_states[1][j, : lens[i]].numpy()
                hl[off[i] : off[i] + lens[i]] = out.hidden_states[layers][j, : lens[i]].numpy()
    # The cached states pool to what the library encodes (float16 storage: 1e-2 of a coordinate at most).
    sample = np.arange(0, len(sents), max(1, len(sents) // 200))
    mine = np.stack([(h1[off[i] : off[i + 1]].astype(np.float64) + hl[off[i] : off[i + 1]]).mean(0) for i in sample])
    lib = encoder.encode([sents[i] for i in sample])
    cos = (mine * lib).sum(1) / np.linalg.norm(mine, axis=1) / np.linalg.norm(lib, axis=1)
    assert cos.min() > 0.9999, f"cached states do not pool to SentenceEncoder's vectors (min cosine {cos.min()})"
    args.cache.mkdir(parents=True, exist_ok=True)
    flat = np.concatenate([np.array(x) for x in ids]).astype(np.int32)
    np.savez(args.cache / f"{args.name}.npz", H1=h1, HL=hl, ids=flat, offsets=off)
    (args.cache / f"{args.name}.sents.txt").write_text("\n".join(sents), encoding="utf-8")
    print(f"{args.name}: {len(sents)} sentences, pooling check min cosine {cos.min():.6f}")


# -- 2. cases -----------------------------------------------------------------------------------------------------


def unit(X: np.ndarray) -> np.ndarray:
    return X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)


def oas(eig: np.ndarray, n: int) -> float:
    p, mu, al = len(eig), eig.mean(), (eig**2).sum() / len(eig) ** 2
    den = (n + 1) * (al - mu**2 / p)
    return 1.0 if den <= 0 else min((al + mu**2) / den, 1.0)


class States:
    """Cached token states of one encoder, pooled per set with per-token weights."""

    def __init__(self, cache: Path, name: str) -> None:
        z = np.load(cache / f"{name}.npz")
        self.h1, self.hl, self.ids, self.off = z["H1"], z["HL"], z["ids"], z["offsets"]
        sents = (cache / f"{name}.sents.txt").read_text(encoding="utf-8").split("\n")
        self.index = {s: i for i, s in enumerate(sents)}

    def pool(self, rows: np.ndarray, kind: str, w: np.ndarray | None) -> np.ndarray:
        starts, ends = self.off[rows], self.off[rows + 1]
        if kind == "cls":
            return self.hl[starts].astype(np.float64)
        tok = np.concatenate([np.arange(a, b) for a, b in zip(starts, ends, strict=True)])
        seg = np.concatenate([[0], np.cumsum(ends - starts)])[:-1]
        states = self.hl[tok].astype(np.float64)
        if kind == "fla":
            states = (self.h1[tok].astype(np.float64) + states) / 2
        ww = np.ones(len(tok)) if w is None else w[tok]
        return np.add.reduceat(states * ww[:, None], seg, axis=0) / np.add.reduceat(ww, seg)[:, None]

    def weights(self, fit_rows: np.ndarray, weighting: str) -> np.ndarray | None:
        """Weight of every token occurrence for ``weighting`` = none | KIND_SOURCE (sif/usif/idf x own/gut/mix)."""
        if weighting == "none":
            return None
        from bertflow.encoding.pooling.weighting import Weighting
        from bertflow.encoding.token_stats import TokenStatistics

        kind, source = weighting.split("_")
        tokens = [self.ids[self.off[r] : self.off[r + 1]] for r in fit_rows]
        vocab = available_priors()[0].statistics.vocab_size
        counts = np.bincount(np.concatenate(tokens), minlength=vocab)
        df = np.zeros(vocab, np.int64)
        for t in tokens:
            df[np.unique(t)] += 1
        own = TokenStatistics(counts, df, len(tokens))
        prior = available_priors()[0].statistics
        stats = {"own": own, "gut": prior, "mix": own + prior}[source]
        return Weighting.parse(kind).table(stats)[self.ids]


def eval_sets(tasks, index, level: str) -> list[tuple]:
    """(name, fitting rows, i1, i2, gold, subset label per pair): per set, or per task (the target regime)."""
    out = []
    for t in tasks.values():
        pick = lambda pairs: np.array([index[s] for s in pairs])  # noqa: E731
        if level == "task" or t.name in ("STS-B", "SICK-R"):
            subsets = list(t.eval_subsets.items())
            fit = pick(t.fit_sentences("target"))
            names = [t.name]
            groups = [subsets]
        else:
            names = [f"{t.name}/{k}" for k in t.eval_subsets]
            groups = [[(k, p)] for k, p in t.eval_subsets.items()]
            fit = None
        for name, group in zip(names, groups, strict=True):
            rows = fit if fit is not None else pick(list(dict.fromkeys(s for _, p in group for s in p.sentences())))
            i1 = np.concatenate([pick(p.sentences1) for _, p in group])
            i2 = np.concatenate([pick(p.sentences2) for _, p in group])
            gold = np.concatenate([np.asarray(p.scores) for _, p in group])
            lab = np.concatenate([[j] * len(p) for j, (_, p) in enumerate(group)])
            out.append((name, rows, i1, i2, gold, lab))
    return out


def case(states: States, pool: str, weighting: str, item: tuple, size, rng) -> dict:
    name, fit, i1, i2, gold, lab = item
    rows = fit if size == "full" else rng.choice(fit, size, replace=False)
    w = states.weights(rows, weighting)
    need = np.unique(np.concatenate([rows, i1, i2]))
    P = states.pool(need, pool, w)
    pos = {r: j for j, r in enumerate(need)}
    X, A, B = (P[[pos[r] for r in r_]] for r_ in (rows, i1, i2))
    mu, cov = X.mean(0), np.cov(X, rowvar=False, bias=True)
    eig, V = np.linalg.eigh(cov)
    eig, V = eig[::-1].clip(0), V[:, ::-1]
    n, d = X.shape
    m = unit(X).mean(0)
    rho = oas(eig, n)
    lam = eig + (rho / (1 - min(rho, 0.99)) * eig.mean() if n <= d else 0.0)  # the library's singular shrinkage
    keep = lam > 1e-6 * lam[0]
    cos = {"raw": (unit(A) * unit(B)).sum(1)}
    for al in ALPHAS:
        W = V[:, keep] * lam[keep] ** (-al / 2)
        cos[f"a{al}"] = (unit((A - mu) @ W) * unit((B - mu) @ W)).sum(1)
    return {
        "pool": pool, "weight": weighting, "set": name, "size": size, "n": n, "d": d, "aniso": float(m @ m),
        "gold": gold.tolist(), "lab": lab.tolist(), "cos": {k: v.astype(np.float32).tolist() for k, v in cos.items()},
        "_X": X, "_AB": (A, B),
    }  # fmt: skip


def check_against_library(c: dict) -> float:
    """Max |cosine difference| between this study's fast auto candidate and the library's AutoCalibrator."""
    X, (A, B) = c.pop("_X"), c.pop("_AB")
    auto = AutoCalibrator().fit(X, token_anisotropy=0.6 if c["weight"] != "none" else 0.1)
    beta = c["aniso"] * min(1.0, c["n"] / c["d"])
    fast = (1 - beta) * np.array(c["cos"]["raw"]) + beta * np.array(c["cos"][f"a{auto.alpha_}"])
    za, zb = auto.transform(A), auto.transform(B)
    lib = (unit(za) * unit(zb)).sum(1)
    return float(np.abs(fast - lib).max())


def cases(args: argparse.Namespace) -> None:
    states = States(args.cache, args.name)
    tasks = load_sts_tasks(data_dir=args.data)
    rng = np.random.default_rng(0)
    for level in ("set", "task"):
        out, started = [], time.time()
        for pool in ("mean", "fla", "cls"):
            for weighting in args.weightings.split(","):
                if pool == "cls" and weighting != "none":
                    continue  # cls reads one token: no weighting applies
                for item in eval_sets(tasks, states.index, level):
                    for size in SIZES if level == "set" else ("full",):
                        if size != "full" and len(item[1]) <= size * 1.5:
                            continue
                        c = case(states, pool, weighting, item, size, rng)
                        if not out:
                            diff = check_against_library(c)
                            assert diff < 1e-4, f"the study's auto differs from AutoCalibrator by {diff}"
                        c.pop("_X", None), c.pop("_AB", None)
                        out.append(c)
            print(level, pool, len(out), f"{time.time() - started:.0f} s", flush=True)
        (args.cache / f"cases_{args.name}_{level}.json").write_text(json.dumps(out))


# -- 3. report ------------------------------------------------------------------------------------------------------


def spearman(x, g) -> float:
    return 100 * float(spearmanr(x, g).statistic)


def load_cases(cache: Path, name: str, level: str) -> list[dict]:
    out = json.loads((cache / f"cases_{name}_{level}.json").read_text())
    for c in out:
        c["enc"] = name
        c["gold"], c["lab"] = np.array(c["gold"]), np.array(c["lab"])
        c["cos"] = {k.replace("_none", ""): np.array(v) for k, v in c["cos"].items()}
    return out


def beta_of(c: dict, rule: str) -> float:
    n, d = c["n"], c["d"]
    r = {"1": None, "a": 1.0, "a*min(1,N/D)": min(1.0, n / d), "a*N/(N+D)": n / (n + d)}[rule]
    return 1.0 if r is None else c["aniso"] * r


def score(c: dict, alpha: float | None, beta_rule: str, protocol: str = "all") -> float:
    cos = c["cos"]["raw"] if alpha is None else None
    if alpha is not None:
        b = beta_of(c, beta_rule)
        cos = (1 - b) * c["cos"]["raw"] + b * c["cos"][f"a{alpha}"]
    if protocol == "all":
        return spearman(cos, c["gold"])
    labs = np.unique(c["lab"])
    sizes = [(c["lab"] == lab).sum() for lab in labs]
    per = [spearman(cos[c["lab"] == lab], c["gold"][c["lab"] == lab]) for lab in labs]
    return float(np.average(per, weights=sizes))


RULES = [
    {"w_raw": w, "a_raw": ar, "a_con": ac, "beta": b}
    for w in ("none", "sif_own", "sif_gut")
    for ar in (0.5, 0.75, 1.0)
    for ac in (0.5, 0.75)
    for b in ("a", "a*min(1,N/D)", "a*N/(N+D)")
]
CHOSEN = {"w_raw": "sif_gut", "a_raw": 0.75, "a_con": 0.5, "beta": "a*min(1,N/D)"}  # what auto.py implements


def rule_score(G: dict, unit_: tuple, rule: dict) -> float | None:
    """Score of a rule on one (encoder, pooling, set, size): the raw encoder is told apart by token anisotropy."""
    enc, pool = unit_[0], unit_[1]
    raw_enc = enc == "raw"  # token anisotropy 0.52-0.73 vs 0.03-0.35 on every set and size: the rule's t
    w = rule["w_raw"] if raw_enc and pool != "cls" else "none"
    c = G.get((*unit_, w))
    return None if c is None else score(c, rule["a_raw"] if raw_enc else rule["a_con"], rule["beta"])


def summary(gains) -> dict:
    g = np.array(gains)
    return {"mean": float(g.mean()), "worst": float(g.min()), "below_2": int((g < -2).sum()), "n": len(g)}


def objective(gains) -> float:
    g = np.array(gains)
    return float(g.mean() - 5 * (g < -2).mean() - np.maximum(0, -g - 2).mean())


def report(args: argparse.Namespace) -> None:
    names = [n for n in ("raw", "minilm") if (args.cache / f"cases_{n}_set.json").exists()]
    cs = [c for n in names for c in load_cases(args.cache, n, "set")]
    G = {(c["enc"], c["pool"], c["set"], c["size"], c["weight"]): c for c in cs}
    units = sorted({k[:4] for k in G}, key=str)
    raw = {u: score(G[(*u, "none")], None, "1") for u in units}
    gains = {}

    def gain(u, rule):
        k = (u, tuple(sorted(rule.items())))
        if k not in gains:
            s = rule_score(G, u, rule)
            gains[k] = None if s is None else s - raw[u]
        return gains[k]

    def obj(rule, us):
        return np.mean([objective([gain(u, rule) for u in us if u[0] == e]) for e in names])

    datasets = sorted({u[2].split("/")[0] for u in units})
    lodo, held = {}, []
    for d in datasets:
        train = [u for u in units if u[2].split("/")[0] != d]
        lodo[d] = max(RULES, key=lambda r, train=train: obj(r, train))
        held += [(u, gain(u, lodo[d])) for u in units if u[2].split("/")[0] == d]
    baselines = {
        "whitening": lambda c: score(c, 1.0, "1"),
        "anchored (alpha 0.5, beta a)": lambda c: score(c, 0.5, "a"),
    }
    table = collections.defaultdict(dict)
    for e in names:
        for p in ("mean", "fla", "cls"):
            us = [u for u in units if u[0] == e and u[1] == p]
            for size in SIZES:
                su = [u for u in us if u[3] == size]
                row = table[f"{e} {p} {size}"]
                row["raw"] = float(np.mean([raw[u] for u in su]))
                row["n_sets"] = len(su)
                for bname, fn in baselines.items():
                    row[bname] = summary([fn(G[(*u, "none")]) - raw[u] for u in su])
                row["auto (chosen)"] = summary([gain(u, CHOSEN) for u in su])
                row["auto (LODO held-out)"] = summary([g for u, g in held if u in su])
                if e == "raw" and p != "cls":
                    row["SIF own counts, raw cosine"] = summary(
                        [spearman(G[(*u, "sif_own")]["cos"]["raw"], G[(*u, "sif_own")]["gold"]) - raw[u] for u in su]
                    )
                    row["SIF generic prior, raw cosine"] = summary(
                        [spearman(G[(*u, "sif_gut")]["cos"]["raw"], G[(*u, "sif_gut")]["gold"]) - raw[u] for u in su]
                    )
    chosen_on_all = max(RULES, key=lambda r: obj(r, units))
    result = {"lodo_picks": lodo, "chosen_on_all": chosen_on_all, "implemented": CHOSEN, "per_set": table}
    result["task_level"] = task_level(args.cache, names)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str))
    args.output.with_suffix(".md").write_text(render(result))
    print(render(result))


def task_level(cache: Path, names: list[str]) -> dict:
    """The 7-task target regime ("all" / "wmean"): raw, whitening, anchored and the chosen rule, per weighting."""
    out = {}
    for n in names:
        path = cache / f"cases_{n}_task.json"
        if not path.exists():
            continue
        cs = load_cases(cache, n, "task")
        for p in ("mean", "fla", "cls"):
            for w in sorted({c["weight"] for c in cs}):
                sel = [c for c in cs if c["pool"] == p and c["weight"] == w]
                if not sel:
                    continue
                a = CHOSEN["a_raw"] if n == "raw" else CHOSEN["a_con"]
                row = {}
                for label, alpha, beta in (("raw cosine", None, "1"), ("whitening", 1.0, "1"),
                                           ("anchored", 0.5, "a"), ("auto rule", a, CHOSEN["beta"])):  # fmt: skip
                    row[label] = [float(np.mean([score(c, alpha, beta, pr) for c in sel])) for pr in ("all", "wmean")]
                out[f"{n} {p} {w}"] = row
    return out


def render(result: dict) -> str:
    lines = ["# `auto` rule study (benchmarks/auto_rule.py)", "", "## Per set (each fitted on its own sentences)", ""]
    lines += ["Gain over the raw encoder (same encoder, same pooling, unweighted), Spearman x100: mean / worst set / "
              "sets more than 2 below raw.", ""]  # fmt: skip
    cols = sorted({k for row in result["per_set"].values() for k in row if k not in ("raw", "n_sets")})
    lines += ["| encoder pooling size | sets | raw mean | " + " | ".join(cols) + " |", "|---" * (len(cols) + 3) + "|"]
    for key, row in result["per_set"].items():
        cells = [
            f"{row[c]['mean']:+.2f} / {row[c]['worst']:+.1f} / {row[c]['below_2']}" if c in row else "" for c in cols
        ]
        lines.append(f"| {key} | {row['n_sets']} | {row['raw']:.2f} | " + " | ".join(cells) + " |")
    lines += ["", "## Leave-one-dataset-out picks", ""]
    lines += [f"- held out {d}: {r}" for d, r in result["lodo_picks"].items()]
    lines += ["", f"Chosen on all sets: {result['chosen_on_all']}; implemented in calibrators/auto.py: "
              f"{result['implemented']}", "", "## 7-task target regime (\"all\" / \"wmean\")", ""]  # fmt: skip
    lines += ["| encoder pooling weighting | raw cosine | whitening | anchored | auto rule |", "|---|---|---|---|---|"]
    for key, row in result["task_level"].items():
        lines.append(f"| {key} | " + " | ".join(f"{v[0]:.2f} / {v[1]:.2f}" for v in row.values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("dump", "cases", "report"):
        p = sub.add_parser(name)
        p.add_argument("--cache", type=Path, required=True)
        p.add_argument("--data", type=Path, default=DATA)
        if name != "report":
            p.add_argument("--name", required=True)
        if name == "dump":
            p.add_argument("--model", required=True)
        if name == "cases":
            p.add_argument("--weightings", default="none,sif_own,sif_gut")
        if name == "report":
            p.add_argument("--output", type=Path, required=True)
    args = parser.parse_args()
    {"dump": dump, "cases": cases, "report": report}[args.command](args)


if __name__ == "__main__":
    main()
