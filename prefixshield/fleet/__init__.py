"""A fleet: N engines (each the single-replica [`Engine`][prefixshield.simulator.engine.Engine],
with its own block pool, policy and scheduler) behind a router that picks a replica for each
request at its arrival. `prefixshield.fleet.run.run_fleet` is the entry point."""
