-- pg_idgen 0.6.0 -> 0.6.1 (ALTER EXTENSION pg_idgen UPDATE).
-- No SQL object changes: 0.6.1 changes only the library (on Citus, the
-- connections between nodes are bounded per node and never take a slot
-- reserved for administrators; see CHANGELOG.md). The script exists so that
-- the extension's recorded version follows the library's.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.6.1'" to load this file. \quit
