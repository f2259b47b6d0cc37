"""scopecast's benchmark suite.

`python -m benchmarks.harness` (or `scopecast bench`, `make bench`) runs the throughput suite:
one publisher process to 1, 2, 4 subscriber processes, against a plain-socket multicast baseline
measured in the same run, then the peer suite (scopecast beside Redis, NATS, ZeroMQ and Ray-native
fan-out, throughput at saturation), the loss suite and the Spark pipeline suite, and writes
`benchmarks/results/<timestamp>.json`, `latest.json` and PNGs.

Modules, one job each:
    harness     the command line and the run: cases, results file, summary
    cases       one case (scopecast, baseline or a peer): start its processes, collect summaries
    peer_suite  every system side by side: the saturation search, its table and plot
    peers       the peers' sender and receiver processes, one module each, and their servers
    procs       child processes: own session, line protocol with deadlines, always killed
    meter       the measured window and CPU bookkeeping shared by every measuring process
    throughput  scopecast publisher and subscriber processes (`python -m benchmarks.throughput`)
    baseline    plain multicast sender and receiver processes (`python -m benchmarks.baseline`)
    analysis    rates, losses, CPU per message, ratios and targets from the processes' summaries
    report      the markdown table and the PNG plot
    machine     what machine (and which code) the numbers were measured on
    datagram_cost  CPU per datagram of one member's receive and send paths, no sockets' noise
                (`python -m benchmarks.datagram_cost`)
"""
