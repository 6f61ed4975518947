#!/usr/bin/env bash
# README's main command: set-up (idempotent), then the main job on the embedded default data.
# Breast cancer (shipped by scikit-learn) is split horizontally over 3 clients, a one-pass FedPC
# (LearnSPN clients) is trained under mpiexec (1 server + 3 client ranks), evaluated with the
# distributed upward pass, and a result table is printed (test LL, accuracy, bytes per link,
# wall time). Outputs go to ${MPIFC_DEMO_OUT:-results/demo}.
#   MPIFC_DEMO_SETTING=vertical|hybrid bash launch/demo.sh   # other FL settings
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh" ""
cd "$MPIFC_ROOT"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
out="${MPIFC_DEMO_OUT:-results/demo}"
setting="${MPIFC_DEMO_SETTING:-horizontal}"
clients=3
mkdir -p "$out"
PY="$MPIFC_VENV/bin/python"

echo "== MPI and ranks"
mpiexec -n 2 "$PY" -m mpifc info
echo "== data_prep: breast-cancer, $setting, $clients clients"
"$PY" -m data_prep --dataset breast-cancer --setting "$setting" --clients "$clients" --seed 0 \
  --out "$out/shards"
ranks=$((clients + 1))
glue=cooccurrence   # the only glue that learns cross-client dependence; needs aligned sample ids
[ "$setting" = horizontal ] && glue=random
echo "== train: one-pass FedPC on $ranks ranks"
t0=$(date +%s.%N)
mpiexec -n "$ranks" "$PY" -m mpifc train "$out/shards" --learner learnspn --threshold 0.4 \
  --min-instances-slice 30 --glue "$glue" --clusters 2 --seed 0 \
  --model "$out/fedpc.h5" --ledger "$out/train-ledger.csv" --json > "$out/train.json"
t1=$(date +%s.%N)
echo "== evaluate: distributed upward pass"
mpiexec -n "$ranks" "$PY" -m mpifc evaluate "$out/shards" --model "$out/fedpc.h5" --distributed \
  --ledger "$out/query-ledger.csv" --json > "$out/evaluate.json"
t2=$(date +%s.%N)
"$PY" - "$out" "$t0" "$t1" "$t2" <<'PYEOF'
import csv, json, sys
from collections import defaultdict
out, t0, t1, t2 = sys.argv[1], *map(float, sys.argv[2:])
def last_json(path):
    lines = [l for l in open(path) if l.strip().startswith("{")]
    return json.loads(lines[-1])
tr, ev = last_json(f"{out}/train.json"), last_json(f"{out}/evaluate.json")
print()
print("| metric | value |")
print("|---|---|")
print(f"| test log-likelihood (nats/sample) | {ev['test_ll']:.3f} |")
print(f"| accuracy | {ev['accuracy']:.3f} |")
print(f"| macro F1 | {ev['f1_macro']:.3f} |")
print(f"| training bytes | {tr.get('bytes_train', ev.get('bytes_train'))} |")
print(f"| query bytes | {ev['bytes_query']} |")
print(f"| train critical path (CPU s, slowest client + server) | {tr.get('train_seconds_critical_path', float('nan')):.3f} |")
print(f"| wall time train / evaluate (s) | {t1 - t0:.1f} / {t2 - t1:.1f} |")
print()
links = defaultdict(lambda: [0, 0])
for name in ("train-ledger.csv", "query-ledger.csv"):
    with open(f"{out}/{name}") as f:
        for row in csv.DictReader(f):
            key = (name.split("-")[0], row["src"], row["dst"])
            links[key][0] += 1
            links[key][1] += int(row["payload_bytes"]) + int(row["header_bytes"])
print("| phase | link | messages | bytes |")
print("|---|---|---|---|")
for (phase, s, d), (n, b) in sorted(links.items()):
    print(f"| {phase} | {s} -> {d} | {n} | {b} |")
print(f"\nresults in {out}/ (model fedpc.h5, ledgers *.csv, train.json, evaluate.json)")
PYEOF
