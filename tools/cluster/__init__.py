"""Real clusters on this machine for failover tests: a RabbitMQ cluster of three nodes
(:mod:`tools.cluster.rabbit`) and a PostgreSQL primary with a streaming standby
(:mod:`tools.cluster.postgres`)."""
