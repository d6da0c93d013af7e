"""Fakes shipped for tests and benchmarks: they stand in for time and the network, never for
the logic under test.

  fake_clock  FakeClock: virtual time driven by advance(); sleeps resolve in deadline order
              (optionally batched within a `resolution`, for large simulations)
  memnet      in-memory network with loss, delay, duplication, reordering, partitions and
              per-link latency (sites)
  poll        wait_until / wait_until_sync / wait_for_value: the one polling helper for tests
              on real time
  shared_data shared_data() / require_data(): the measured data directory, and the rule for
              a missing file (skip outside CI, fail in CI)
  members     joined(): a key whose JOIN record is in a replica (so its facts are accepted)
  tls_files   write_cert(cert, key, cn): a self-signed ECDSA certificate and key as PEM files
  sinks       MemorySink / NoSink: in-memory StreamSinks for calling Ingress.serve
  benchmark_module  load_benchmark(name): a benchmarks/ script as a module (tests of its
              pure parts)
  work        python_lines(f, *args): the Python lines a call runs (a hostile input's cost
              bounded without a clock)
"""
