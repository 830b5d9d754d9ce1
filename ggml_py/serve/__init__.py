"""ggml-server: an OpenAI-compatible HTTP server over the batch scheduler (docs/server.md).

Needs the `server` extra (FastAPI, uvicorn, sse-starlette, prometheus-client):
`pip install "ggml_py[server]"`. One scheduler thread owns the model and steps its
batch (scheduler.py); the HTTP handlers (app.py) check requests (params.py), enqueue
them and stream what the scheduler hands back, in OpenAI's formats (responses.py).
"""
