#!/usr/bin/env bash
# Reproduces the measurement behind .ci/run's background build (docs/development.md, "CI"): bash bench/autogroup_nice.sh
# A fixed CPU workload (2 processes, each 60M loop steps, in a session of its own like a run of make test) alone,
# then beside 2 busy loops started as .ci/run starts the llama.cpp build: (a) setsid + nice 19, (b) setsid + nice 19
# + autogroup nice 19. Prints the workload's wall seconds; CPU flags first.
grep -m1 -o 'avx512f\|avx2' /proc/cpuinfo | head -1; cat /proc/sys/kernel/sched_autogroup_enabled
work() { setsid bash -c 's=$(date +%s.%N); for i in 1 2; do python3 -c "
n=0
for i in range(60_000_000): n+=i
" & done; wait; echo "$(echo "$(date +%s.%N) - $s" | bc)"'; }
burn() { for i in 1 2; do python3 -c "while True: pass" & done; wait; }
for rep in 1 2 3; do
  echo "rep $rep alone: $(work)"
  setsid bash -c "exec nice -n 19 bash -c '$(declare -f burn); burn'" & b=$!; sleep 1
  echo "rep $rep nice 19 in its own session: $(work)"; kill -- -$b 2>/dev/null; sleep 1
  setsid bash -c "echo 19 >/proc/self/autogroup; exec nice -n 19 bash -c '$(declare -f burn); burn'" & b=$!; sleep 1
  echo "rep $rep nice 19 + autogroup nice 19: $(work)"; kill -- -$b 2>/dev/null; sleep 1
done
