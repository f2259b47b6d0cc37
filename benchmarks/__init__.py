"""scopecast's benchmark suite.

`python -m benchmarks.harness` (or `scopecast bench`, `make bench`) runs the throughput suite:
one publisher process to 1, 2, 4 subscriber processes, against a plain-socket multicast baseline
measured in the same run, and writes `benchmarks/results/<timestamp>.json`, `latest.json` and a PNG.

Modules, one job each:
    harness     the command line and the run: cases, results file, summary
    cases       one case (scopecast or baseline): start its processes, collect their summaries
    procs       child processes: own session, line protocol with deadlines, always killed
    meter       the measured window and CPU bookkeeping shared by every measuring process
    throughput  scopecast publisher and subscriber processes (`python -m benchmarks.throughput`)
    baseline    plain multicast sender and receiver processes (`python -m benchmarks.baseline`)
    analysis    rates, losses, CPU per message, ratios and targets from the processes' summaries
    report      the markdown table and the PNG plot
    machine     what machine (and which code) the numbers were measured on
"""
