-- pg_idgen 0.12.0 -> 0.13.0 (ALTER EXTENSION pg_idgen UPDATE).
-- No SQL object changes: 0.13.0 changes only the library (on a Citus
-- cluster, calls to another node go over each session's own connection,
-- counted per node, and the forwarder is gone; see CHANGELOG.md). The script
-- exists so that the extension's recorded version follows the library's.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.13.0'" to load this file. \quit
