-- pg_idgen 0.8.0 -> 0.8.1 (ALTER EXTENSION pg_idgen UPDATE).
-- No SQL object changes: 0.8.1 changes only the library (fixes to the Citus
-- forwarder; see CHANGELOG.md). The script exists so that the extension's
-- recorded version follows the library's.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.8.1'" to load this file. \quit
