# Session 18, call f: each chunk's sentences checked on its own preparing thread instead of by the feeder thread (call
# d's timeline: sending the first chunk's parts took 12 ms while the feeder checked the next chunks). The old code is
# the commit before (carried as base/src). Rule fixed before the call: the change stays if the MiniLM-L6 first pass
# wins at least 3 of 4 interleaved pairs and BERT-base's first pass (one pair) is not lower by more than 5%. Then the
# CUDA tests of the pipeline's files and the timeline probe of the new code.
export PYTHONUNBUFFERED=1
G=$PWD/.speed/gpu; B=$PWD/benchmarks; S=$PWD/src; R=$PWD/docs/results/issue23/thirteenth_pass_1xGPU
echo commit $(cat $G/commit); nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader; nproc
tp() { # tag src arch
  PYTHONPATH=$2:$B timeout 150 python3 $B/gpu_checks.py throughput --tokenizer-dir $G/tok --data-dir $G/sts --archs $3 --rounds 3 --ruler --counters --json $OUT/$1.json > /dev/null 2>$OUT/err_$1.txt || tail -5 $OUT/err_$1.txt
  python3 - $OUT/$1.json $1 <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for arch, r in d["runs"].items():
    c = r["counters"]
    print(f"{sys.argv[2]:>8} first {r['rounds'][0]/1e3:6.1f}k warm {r['warm_sentences_per_s']/1e3:6.1f}k rounds {[round(x/1e3,1) for x in r['rounds']]} waits {[round(x['main_chunk_wait_s']*1e3) for x in c]} ms ruler {r.get('ruler_ms')}")
PY
}
tp m_new1 $S minilm-l6; tp m_old1 $G/base/src minilm-l6
tp m_old2 $G/base/src minilm-l6; tp m_new2 $S minilm-l6
tp m_new3 $S minilm-l6; tp m_old3 $G/base/src minilm-l6
tp m_old4 $G/base/src minilm-l6; tp m_new4 $S minilm-l6
tp b_old1 $G/base/src bert-base; tp b_new1 $S bert-base
PYTHONPATH=$S:$B:$PWD timeout 150 python3 $B/gpu_checks.py tests --commit $(cat $G/commit) --test-files tests/encoding/test_stream.py,tests/encoding/test_tokenizer_pool.py,tests/encoding/test_graphs.py --json $OUT/tests.json > /dev/null 2>$OUT/tests_err.txt || tail -5 $OUT/tests_err.txt
python3 -c "import json; d = json.load(open('$OUT/tests.json')); print('tests', d['counts'], d['exit_status'], d['not_passed'])" || true
(cd $G && timeout 90 python3 $R/timeline_probe.py minilm-l6 > $OUT/timeline_checks_on_chunk_threads.txt 2>&1; grep -A16 "pass 3" $OUT/timeline_checks_on_chunk_threads.txt; tail -1 $OUT/timeline_checks_on_chunk_threads.txt)
cd $OUT && tar czf results.tgz *.json err_*.txt tests_err.txt timeline_*.txt 2>/dev/null; rm -f *.json err_*.txt tests_err.txt timeline_*.txt; ls
