"""The benchmark harness (benchmarks/harness/) computes what it claims (no timing is asserted: speed targets live in
docs/performance.md)."""

from __future__ import annotations

import contextlib
import time

import harness as bench
import numpy as np
import pytest
import torch

from ..conftest import SENTENCES


def test_interleave_alternates_order_and_counts_rounds():
    calls: list[str] = []
    times = bench.interleave({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, {"a": 3, "b": 2})
    assert calls == ["a", "b", "b", "a", "a"]  # A B, then B A, then A alone
    assert [len(times["a"]), len(times["b"])] == [3, 2] and all(t >= 0 for t in times["a"] + times["b"])


def test_interleave_enters_around_each_run_outside_its_timing():
    events: list[str] = []

    @contextlib.contextmanager
    def around(name):
        events.append(f"enter {name}")
        time.sleep(0.05)  # outside the timed window: no run may take this long
        yield
        events.append(f"leave {name}")
        time.sleep(0.05)

    runs = {"a": lambda: events.append("a"), "b": lambda: events.append("b")}
    times = bench.interleave(runs, 2, around)
    assert events == [f"{e} {n}" if e else n for n in "abba" for e in ("enter", "", "leave")]
    assert max(times["a"] + times["b"]) < 0.05


def test_st_padded_tokens_follows_character_sort_and_fixed_batches():
    texts = ["aaaa", "a", "aaa", "aa"]  # sorted by characters: aaaa, aaa, aa, a
    lengths = np.array([3, 9, 4, 5])  # token counts that disagree with the character order
    # batches of 2 in character order: (3, 4) -> 2 x 4, then (5, 9) -> 2 x 9
    assert bench.st_padded_tokens(lengths, texts, 2) == 2 * 4 + 2 * 9
    assert bench.st_padded_tokens(lengths, texts, 4) == 4 * 9


def test_model_flops_formula():
    class Cfg:
        num_hidden_layers, hidden_size, intermediate_size = 2, 8, 32

    per_token = 2 * 2 * (4 * 64 + 2 * 8 * 32)
    assert bench.model_flops(Cfg, np.array([3])) == 3 * per_token + 4 * 2 * 8 * 9
    # BERT-base at 32 tokens: about 0.17-0.18 GFLOP per token (performance notes, B3)
    base = type("B", (), {"num_hidden_layers": 12, "hidden_size": 768, "intermediate_size": 3072})
    assert 0.16e9 < bench.model_flops(base, np.array([32])) / 32 < 0.19e9


def test_text_sets_are_deterministic():
    a = bench.synthetic_sentences(50, seed=3)
    assert a == bench.synthetic_sentences(50, seed=3) and len(a) == 50 and all(s.strip() for s in a)
    rep = bench.replicate(SENTENCES, 20)
    assert len(rep) == 20 and set(rep) == set(SENTENCES)
    long = bench.long_texts(a, 5, per_text=(3, 4))
    assert len(long) == 5 and all(len(t) > max(map(len, a[:1])) for t in long)


def test_bench_encode_reports_both_systems(tiny_model_dir):
    pytest.importorskip("sentence_transformers")
    texts = bench.replicate(SENTENCES, 40)
    out = bench.bench_encode(
        str(tiny_model_dir),
        {"sts": (texts, 32)},
        device="cpu",
        st_batch_sizes=(4,),
        rounds=1,
        variants={"fill 0": {"uniform_fill": 0.0}},
        log=lambda _: None,
    )
    entry = out["datasets"]["sts"]
    assert set(entry["systems"]) == {"bertflow", "sentence-transformers bs=4"}
    for metrics in [*entry["systems"].values(), *entry["variants"].values()]:
        assert metrics["sentences_per_s"] > 0 and 0 < metrics["padding_efficiency"] <= 1
        assert metrics["padded_tokens_per_s"] >= metrics["real_tokens_per_s"]
    assert entry["variants"]["fill 0"]["padding_efficiency"] == 1.0  # uniform batches carry no padding
    assert entry["ratios"]["bertflow / sentence-transformers bs=4"] > 0
    assert entry["agreement_min_cosine"] > 0.9999  # same model, same pooling, both fp32: same vectors


def test_flow_fit_report(anisotropic_data):
    X = np.tile(anisotropic_data, (2, 1)).astype(np.float32)
    fit = bench.bench_flow_fit(X, device="cpu", max_steps=3, log=lambda _: None)
    assert fit["steps"] == 3 and fit["epoch_steps"] == 13 and fit["epoch_seconds_estimate"] > 0
    assert fit["cuda_graph"] is False  # there is no graph on the CPU


def test_calibrator_overhead_report(tiny_model_dir):
    from bertflow import SentenceEncoder

    encoder = SentenceEncoder(str(tiny_model_dir), device="cpu")
    over = bench.bench_calibrator_overhead(encoder, SENTENCES * 10, flow_steps=2, rounds=1, log=lambda _: None)
    for name in ("flow", "whitening"):
        m = over[name]
        assert m["overhead"] == pytest.approx(m["embedder_encode_seconds"] / m["encode_seconds"] - 1)
        assert m["max_abs_diff_to_transform"] < 1e-3  # Embedder's on-device calibration is transform()


@pytest.mark.slow
def test_bench_memory_runs_the_cli(tiny_model_dir, tmp_path):
    out = bench.bench_memory(50, str(tiny_model_dir), tmp_path, source=SENTENCES, device="cpu", log=lambda _: None)
    assert out["lines"] == 50 and out["peak_rss_mb"] > 0 and out["output_mb"] > 0
    assert '"rows": 50' in out["stdout"]


def test_flow_fit_gpu_report_off_cuda_times_the_eager_loop_only(anisotropic_data):
    """Off CUDA there is no graph: the report holds the eager runs and no ratio or equality check of a loop with
    itself."""
    X = np.tile(anisotropic_data, (4, 1)).astype(np.float32)
    out = bench.bench_flow_fit_gpu(X, device="cpu", probe_steps=3, rounds=2, full_epoch=False, log=lambda _: None)
    assert out["cuda_graph"] is None and "eager / cuda_graph" not in out and "graph_equals_eager" not in out
    assert len(out["eager"]["runs"]) == 2 and all(r["steps"] == 3 for r in out["eager"]["runs"])
    assert out["eager"]["ms_per_step"] == pytest.approx(np.median([r["ms_per_step"] for r in out["eager"]["runs"]]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
def test_flow_fit_gpu_report_compares_the_graph_with_the_eager_loop(anisotropic_data):
    X = np.tile(anisotropic_data, (125, 1)).astype(np.float32)  # 50,000 rows, like the equality check takes
    out = bench.bench_flow_fit_gpu(X, device="cuda", probe_steps=3, rounds=1, full_epoch=False, log=lambda _: None)
    assert len(out["cuda_graph"]["runs"]) == len(out["eager"]["runs"]) == 1
    assert out["eager / cuda_graph"] == pytest.approx(out["eager"]["ms_per_step"] / out["cuda_graph"]["ms_per_step"])
    assert out["graph_equals_eager"] == {
        "identical_parameters": True,
        "identical_history": True,
        "max_abs_latent_diff": 0.0,
    }


def test_ruler_records_the_host_speed_during_a_window(tmp_path):
    import time

    def wait_for(condition) -> None:  # a loaded machine may start the ruler process late: wait, do not assume
        deadline = time.monotonic() + 30
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)

    with bench.Ruler(tmp_path / "ruler.bin") as ruler:
        wait_for(lambda: ruler.marks())  # the ruler runs and has written its first repetitions
        start = time.perf_counter()
        time.sleep(0.2)
        end = time.perf_counter()
        wait_for(lambda: ruler.marks()[-1][0] > end)  # and has written past the window
    assert ruler.process.poll() is not None  # stopped at the end of the block
    marks = ruler.marks()
    starts = [t for t, _ in marks]
    assert marks and starts == sorted(starts) and all(dt > 0 for _, dt in marks)
    assert starts[0] < start < end < starts[-1]  # one clock: the window falls inside the ruler's record
    assert ruler.median_ms(starts[0], end) > 0 and ruler.median_ms() > 0
    assert ruler.median_ms(end + 100, end + 200) is None  # nothing recorded then
    ruler.stop()  # twice is fine
    with pytest.raises(FileExistsError, match="ruler.bin exists"):
        bench.Ruler(tmp_path / "ruler.bin")  # its record is not written over
    assert ruler.marks() == marks
