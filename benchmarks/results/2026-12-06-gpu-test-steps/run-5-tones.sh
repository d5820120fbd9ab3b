. benchmarks/gpu_host.sh||exit 1
mkdir -p /tmp/pl /tmp/o; cat >/tmp/pl/tsp.py <<'P'
import os
def pytest_sessionstart(session):
    from tests import tones
    f=tones.train_model; n=int(os.environ["TS"]); s=int(os.environ["SEED"])
    tones.train_model=lambda root: f(root, n, seed=s)
P
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1
for S in 0 1;do for N in 60 80 100 150;do
(TS=$N SEED=$S PYTHONPATH=/tmp/pl:$PYTHONPATH timeout 560 python3 -m pytest -p tsp -x -q -p no:cacheprovider --durations=3 "tests/test_word_timings.py::test_every_words_start_is_within_one_output_frame_of_the_truth" >/tmp/o/n${N}s$S.txt 2>&1; echo "n${N}s$S rc $?") &
done;done;wait
cd /tmp/o; tar czf $OUT/o.tgz .; for f in n*.txt;do echo "== $f";grep -E "passed|failed|^E  |s call|s setup" $f|head -12;done
