"""The store in PostgreSQL with pgvector: what many stateless `codeveil serve` replicas
share (registry.py, PgStore). Imports sync.store.core and never sync.store.embedded;
its modules need psycopg."""
