"""Fakes shipped for tests and benchmarks: they stand in for time and the network, never for
the logic under test.

  fake_clock  FakeClock: virtual time driven by advance(); sleeps resolve in deadline order
  memnet      in-memory network with loss, delay, duplication, reordering and partitions
  members     joined(): a key whose JOIN record is in a replica (so its facts are accepted)
"""
