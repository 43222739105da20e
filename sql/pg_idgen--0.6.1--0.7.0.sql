-- pg_idgen 0.6.1 -> 0.7.0 (ALTER EXTENSION pg_idgen UPDATE).
-- No SQL object changes: 0.7.0 changes only the library (on Citus, the
-- sessions past the connection bound take turns, shared between roles; see
-- CHANGELOG.md). The script exists so that the
-- extension's recorded version follows the library's.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.7.0'" to load this file. \quit
