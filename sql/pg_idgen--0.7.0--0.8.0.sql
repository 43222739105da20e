-- pg_idgen 0.7.0 -> 0.8.0 (ALTER EXTENSION pg_idgen UPDATE).
-- No SQL object changes: 0.8.0 changes only the library (on Citus, a
-- server's sessions mint on other nodes through one forwarder process per
-- server, over a few shared connections per node; see CHANGELOG.md). The
-- script exists so that the extension's recorded version follows the
-- library's.
\echo Use "ALTER EXTENSION pg_idgen UPDATE TO '0.8.0'" to load this file. \quit
