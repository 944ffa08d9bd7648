#!/usr/bin/env bash
# make gpu-check: on a CUDA machine, its own python and torch (no pip, no network), within GPU_CHECK_TOTAL_S = 280 s
# (92-125 s on one H200, measured 2026-12-04, before L=131072, the bandwidth probe and four more test files; the line
# before the last gives each step's seconds against its limit). Steps, results first, each under `timeout` cut to what
# is left of the budget; a failure does not stop the others, and the last line names every one:
#   1. preflight: the packages the steps need and a CUDA device (one line naming what is missing);
#   2. a `quick` sweep, its lengths extended to L=131072 (GPU_CHECK_SEQ_LENS: the H200's measured crossover, L=32768, and
#      the model's, 32768-131072, lie inside), profiler cross-check off, as a run folder in results/ (charts, REPORT.md,
#      breakdown, bandwidth.csv); a dirty tree is said first: commit before a run you will cite;
#   3. the profiler preflight: a tiny CUDA profile in a child process must see the device-to-host copy;
#   4. the same sweep, cross-check on, in 2 processes (skipped, saying why, if 3 failed);
#   5. `kvpages compare` of the two runs; with 2+ GPUs, the quick steps on 2, 4, 8 ranks (up to the GPU count; a run each);
#   6. the CUDA-marked tests; the one that checks a quick sweep's run folder whole checks step 4's instead of sweeping
#      again (left out where step 4 made none).
#
# Usage: bash bench/gpu_check.sh [--archive DIR] [--device cuda|cpu] [--] [pytest options for both sweeps]
#   --archive DIR   tee all output into DIR/gpu_check.log (DIR, relative to the current folder, is created and
#                   holds nothing else) and, after each sweep and at the end, atomically rewrite DIR/runs.tar.gz
#                   with this invocation's run folders as results/<run-id>/... (`tar xzf` it at the repository root).
#   --device cpu    rehearse on the CPU (default: cuda): no profiler preflight, no nvidia-smi, CUDA tests skip.
#   --help          print this header (the one place the usage and exit codes are written) and exit.
#   Other options (or all after `--`) go to both sweeps; run folders go to results/ or a --kv-results given here
#   (relative to the repository root). --arch* or --dev* before `--` is refused as a misspelt --archive or --device.
# Environment: PYTHON (default python3; without kvpages installed, the plugin is loaded by name); limits in seconds:
#   GPU_CHECK_SWEEP_S (each sweep, 150), GPU_CHECK_TESTS_S (the CUDA tests, 240), GPU_CHECK_TOTAL_S (the whole script, 280);
#   GPU_CHECK_SEQ_LENS (both sweeps' --kv-seq-lens, 512,8192,131072; a --kv-seq-lens of yours replaces it).
# Exit codes: 0 every step passed; 1 a step failed or timed out (the last line names them); 2 python packages
#   missing (preflight says how to get them); 3 no CUDA device (one line); 64 a usage error (one line); 130 or 143
#   SIGINT or SIGTERM: the running step is stopped, its run folder archived, the summary printed.
set -uo pipefail  # no -e: a failing step is collected and the next one runs

usage_error() {
    echo "gpu_check.sh: $1 (usage: bash bench/gpu_check.sh --help)" >&2
    exit 64
}

ARCHIVE='' DEVICE=cuda
while (($#)); do
    case $1 in
        --archive)
            (($# >= 2)) && [[ -n $2 && $2 != -* ]] || usage_error "--archive needs a folder, e.g. --archive out"
            ARCHIVE=$2; shift 2 ;;
        --archive=*)
            ARCHIVE=${1#*=}; [[ -n $ARCHIVE ]] || usage_error "--archive needs a folder, e.g. --archive=out"; shift ;;
        --device|--device=*)
            if [[ $1 == --device ]]; then DEVICE=${2-}; shift $(($# >= 2 ? 2 : 1)); else DEVICE=${1#*=}; shift; fi
            [[ $DEVICE == cuda || $DEVICE == cpu ]] || usage_error "--device '$DEVICE': choose cuda or cpu" ;;
        -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; exit 0 ;;
        --) shift; break ;;
        --arch*|--dev*) usage_error "unknown option '$1': this script's own are --archive DIR and --device cuda|cpu" ;;
        *) break ;;
    esac
done
for var in GPU_CHECK_SWEEP_S GPU_CHECK_TESTS_S GPU_CHECK_TOTAL_S; do
    value=${!var-}
    [[ -z $value || $value =~ ^[1-9][0-9]*$ ]] || usage_error "$var='$value': give a whole number of seconds, e.g. 150"
done
SWEEP_S=${GPU_CHECK_SWEEP_S:-150} TESTS_S=${GPU_CHECK_TESTS_S:-240} TOTAL_S=${GPU_CHECK_TOTAL_S:-280}
SEQ_LENS=${GPU_CHECK_SEQ_LENS:-512,8192,131072}
KILL_AFTER=10  # a step that ignores SIGTERM at its limit gets SIGKILL this much later

if [[ -n $ARCHIVE ]]; then
    mkdir -p -- "$ARCHIVE" 2>/dev/null && ARCHIVE=$(cd -- "$ARCHIVE" && pwd) \
        || usage_error "--archive '$ARCHIVE': cannot create that folder"
    LOG=$ARCHIVE/gpu_check.log
    : > "$LOG" || usage_error "--archive '$ARCHIVE': cannot write $LOG"
    exec 3>&1 4>&2                           # the caller's stdout and stderr, restored before exiting
    exec > >(trap '' INT TERM; exec tee -a "$LOG") 2>&1  # tee outlives a signal to the group, to log the end
    TEE_PID=$!
fi

finish() {  # exit with $1 once the log holds everything printed
    if [[ -n $ARCHIVE ]]; then
        exec 1>&3 2>&4 3>&- 4>&-
        wait "$TEE_PID" 2>/dev/null || sleep 0.5  # bash < 4.4 cannot wait for a process substitution
    fi
    exit "$1"
}

cd "$(dirname "$0")/.." || finish 1
PYTHON=${PYTHON:-python3}
export PYTHONUNBUFFERED=1  # through tee and pipes, each line is out before a caller's time limit can strike

if ! "$PYTHON" -c "import importlib.metadata as m; m.distribution('kvpages')" 2>/dev/null; then
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTEST_PLUGINS=kvpages.plugin
fi

# Where the sweeps write: the last --kv-results passed through (as pytest reads them), else results/, passed explicitly.
args=("$@")
RESULTS=''
for ((i = 0; i < ${#args[@]}; i++)); do
    case ${args[i]} in
        --kv-results) ((i + 1 < ${#args[@]})) && RESULTS=${args[i + 1]} ;;
        --kv-results=*) RESULTS=${args[i]#*=} ;;
    esac
done
[[ -n $RESULTS ]] || { RESULTS=results; args=(--kv-results results ${args[@]+"${args[@]}"}); }

echo "== gpu_check.sh --device $DEVICE${ARCHIVE:+ --archive $ARCHIVE}${*:+ -- $*} ($(date -u +%Y-%m-%dT%H:%M:%SZ)," \
     "${HOSTNAME:-unknown host}, python: $PYTHON, run folders into $RESULTS/)"
DEADLINE=$((SECONDS + TOTAL_S))
FAILED=()       # "name (why)" of every failed step
STEPS=0         # steps run
TOOK=()         # "name N s" of every step run, for the time each took against its limit
RUNS=()         # the run folders this invocation made, by name, in $RESULTS
STEP_PID=''     # the running step's timeout process, and its name
STEP_NAME=''
SWEEP_BEFORE=-  # the run folders before the running sweep started ('-': no sweep running)

fail() {  # record a failed step: name, why
    FAILED+=("$1 ($2)")
    echo "== $1 failed: $2"
}

bounded() {  # limit in seconds, command...: run it under timeout, in the background so that a signal to this
    local rc  # script is handled at once (the trap below passes it on to the step); returns its exit status
    timeout --kill-after="$KILL_AFTER" "$@" &
    STEP_PID=$!
    wait "$STEP_PID"
    rc=$?
    STEP_PID=''
    return "$rc"
}

run_step() {  # name, limit in seconds, command...: a step, cut to what is left of the budget; returns its status
    local name=$1 limit=$2 left rc started=$SECONDS
    shift 2
    STEPS=$((STEPS + 1))
    left=$((DEADLINE - SECONDS - KILL_AFTER))
    if ((left < 5)); then
        fail "$name" "not run: the GPU_CHECK_TOTAL_S=$TOTAL_S s budget is spent"
        return 124
    fi
    ((left < limit)) && limit=$left
    echo "== $name (at most $limit s): $*"
    STEP_NAME=$name
    bounded "$limit" "$@"
    rc=$?
    TOOK+=("$name $((SECONDS - started)) of $limit s")
    case $rc in
        0) ;;
        124|137) fail "$name" "exit $rc: timed out after $limit s" ;;
        *) fail "$name" "exit $rc" ;;
    esac
    return "$rc"
}

list_runs() {
    if [[ -d $RESULTS ]]; then find "$RESULTS" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort; fi
}

collect_runs() {  # add the run folders made since SWEEP_BEFORE to RUNS; sets SWEEP_RUN to the last ('' if none)
    local new
    new=$(comm -13 <(echo "$SWEEP_BEFORE") <(list_runs))
    SWEEP_BEFORE=- SWEEP_RUN=''
    if [[ -n $new ]]; then
        mapfile -t -O "${#RUNS[@]}" RUNS <<< "$new"
        SWEEP_RUN=$RESULTS/$(tail -n 1 <<< "$new")
    fi
}

pack() {  # (re)write $ARCHIVE/runs.tar.gz with the run folders made so far, atomically
    [[ -n $ARCHIVE ]] && ((${#RUNS[@]})) || return 0
    local part=$ARCHIVE/runs.tar.gz.part listed
    if tar -czf "$part" -C "$RESULTS" --transform='s,^,results/,' "${RUNS[@]}" && mv -f "$part" "$ARCHIVE/runs.tar.gz"
    then
        printf -v listed 'results/%s ' "${RUNS[@]}"
        echo "== archive: $ARCHIVE/runs.tar.gz holds ${listed% }"
    else
        fail archive "could not write $ARCHIVE/runs.tar.gz"
    fi
}

sweep() {  # name, --kv-crosscheck mode, what it is[, more options]: a quick sweep; sets SWEEP_RUN to its run folder
    local name=$1 mode=$2 what=$3 rc
    shift 3
    echo "== $what"
    SWEEP_BEFORE=$(list_runs)
    run_step "$name" "$SWEEP_S" "$PYTHON" -m pytest bench/ --benchmark-only --kv-preset quick --kv-device "$DEVICE" \
        --kv-seq-lens "$SEQ_LENS" --kv-crosscheck "$mode" --kv-analyze -q --benchmark-quiet -p no:cacheprovider \
        "$@" "${args[@]}"
    rc=$?
    collect_runs
    if [[ -z $SWEEP_RUN ]] && ((rc == 0)); then
        fail "$name" "exit 0, but no run folder appeared in $RESULTS/"
    fi
    pack
}

summarize() {  # each step's time against its limit, then the last line: what failed, or all passed (1 if any failed)
    local where=${ARCHIVE:+; log and runs in $ARCHIVE} took
    if ((${#TOOK[@]})); then
        printf -v took '%s, ' "${TOOK[@]}"
        echo "== took: ${took%, }; $SECONDS of GPU_CHECK_TOTAL_S=$TOTAL_S s in all"
    fi
    if ((${#FAILED[@]})); then
        local listed
        printf -v listed '%s, ' "${FAILED[@]}"
        echo "gpu-check: FAILED ${#FAILED[@]} of $STEPS steps: ${listed%, }$where" >&2
        return 1
    fi
    echo "gpu-check: all $STEPS steps passed$where"
}

interrupted() {  # signal name, exit code: stop the running step, keep what it wrote, archive, summarize
    trap - INT TERM
    echo "== interrupted by SIG$1"
    if [[ -n $STEP_PID ]]; then
        kill -TERM "$STEP_PID" 2>/dev/null  # timeout passes it on to the step's processes
        wait "$STEP_PID"
        FAILED+=("$STEP_NAME (interrupted by SIG$1)")
    fi
    [[ $SWEEP_BEFORE == - ]] || collect_runs
    pack
    summarize
    finish "$2"
}
trap 'interrupted INT 130' INT
trap 'interrupted TERM 143' TERM

# ----------------------------------------------------------------------------- 1. preflight
STEPS=1 STEP_NAME=preflight
if [[ $DEVICE == cuda ]]; then
    bounded 120 "$PYTHON" -m kvpages.preflight --cuda
else
    bounded 120 "$PYTHON" -m kvpages.preflight
fi
rc=$?
case $rc in
    0) ;;
    2|3) finish "$rc" ;;  # preflight said what is missing, in one line
    *) fail preflight "exit $rc, not one of its 0, 2 (packages) or 3 (no CUDA device); going on" ;;
esac
if [[ $DEVICE == cuda ]]; then
    nvidia-smi --query-gpu=name,uuid,driver_version,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current \
        --format=csv || true
else
    echo "== rehearsal on the CPU (--device cpu): the same steps, sweeps on cpu; the CUDA tests will all skip"
fi

# ----------------------------------------------------------------------------- 2.-4. the sweeps
if dirty=$(git status --porcelain -- . ':(exclude)results' 2>/dev/null); then
    echo "== code: commit $(git rev-parse --short HEAD 2>/dev/null)${dirty:+, with $(wc -l <<< "$dirty") file(s) changed}"
    [[ -z $dirty ]] || echo "gpu-check: the tree is dirty: each run's meta.json says so (its code_tree still names the" \
        "code it ran); commit first for runs you will cite"
fi
sweep sweep-off off "quick sweep, profiler cross-check off"
OFF_RUN=$SWEEP_RUN
if [[ $DEVICE == cuda ]]; then
    run_step profiler 135 "$PYTHON" -m kvpages.preflight --profiler
    profiler=$?
else
    echo "== profiler: not checked in a CPU rehearsal (the cross-check on the CPU profiles no link)"
    profiler=0
fi
ON_RUN=''
if ((profiler == 0)); then
    sweep sweep-on on "the same sweep, profiler cross-check on (in its own process), in 2 processes" --kv-processes 2
    ON_RUN=$SWEEP_RUN
else
    echo "== sweep-on skipped: the profiler preflight failed (exit $profiler), so its cross-check could not run"
fi

# ----------------------------------------------------------------------------- 5. compare
if [[ -n $OFF_RUN && -n $ON_RUN ]]; then
    echo "== compare: A = cross-check off, B = cross-check on"
    run_step compare 60 "$PYTHON" -m kvpages compare "$OFF_RUN" "$ON_RUN"
else
    echo "== compare skipped: it needs the run folders of both sweeps (off: ${OFF_RUN:-none}, on: ${ON_RUN:-none})"
fi

# ----------------------------------------------------------------------------- 5b. many ranks at once
if [[ $DEVICE == cuda ]]; then
    GPUS=$("$PYTHON" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
    if ((GPUS >= 2)); then
        for n in 2 4 8; do
            ((n <= GPUS)) || break
            SWEEP_BEFORE=$(list_runs)
            echo "== ranks-$n: the quick preset's steps on $n ranks at once (torchrun, one GPU each)"
            run_step "ranks-$n" "$SWEEP_S" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$n" \
                -m pytest bench/test_steps.py --benchmark-only --kv-preset quick --kv-device cuda --kv-analyze -q \
                --benchmark-quiet -p no:cacheprovider "${args[@]}"
            collect_runs
            pack
        done
    else
        echo "== ranks: not run: this machine has $GPUS CUDA device(s), and a multi-rank run needs one per rank"
    fi
else
    echo "== ranks: not run in a CPU rehearsal (tests/test_ranks.py runs 2 ranks on the CPU)"
fi

# ----------------------------------------------------------------------------- 6. the CUDA-marked tests
# every test file that holds a CUDA-marked test (tests/test_gpu_check.py checks the list)
echo "== CUDA-marked tests (variants, inputs, meter, host mirror, syncs, meter vs profiler, sweep twins, busy queue, a hybrid model's strategies, ranks)"
complete=tests/test_gpu_path.py::test_cuda_quick_sweep_writes_a_complete_run  # a quick sweep's run folder, checked whole
if [[ -n $ON_RUN ]]; then  # step 4's, cross-checked
    export KVPAGES_GPU_CHECK_RUN=$(cd "$ON_RUN" && pwd)
    echo "== cuda-tests: $complete checks $ON_RUN, step 4's run, instead of sweeping again"
    skip=()
else
    echo "== cuda-tests: $complete not run: step 4 made no run folder"
    skip=(--deselect "$complete")
fi
run_step cuda-tests "$TESTS_S" "$PYTHON" -m pytest tests/test_variants.py tests/test_inputs.py tests/test_meter.py \
    tests/test_mirror.py tests/test_syncs.py tests/test_crosscheck.py tests/test_gpu_path.py tests/test_scenarios.py \
    tests/test_payloads.py tests/test_ranks.py -m cuda -q -p no:cacheprovider ${skip[@]+"${skip[@]}"}

pack
summarize
finish $?
