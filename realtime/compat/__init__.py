"""Where realtime depends on what another library does not document: one module per library.

Everything else in realtime uses only what Django, Channels, daphne, uvicorn and psycopg
document. What no public interface offers lives here, each module about one library, each
use checked by a self-test before it is relied on: where the check fails, the module says so
in one ERROR line and realtime falls back to what the public interface allows, never to a
silent degradation. ``docs/architecture.md`` lists every use, why, and the versions tested.
"""
