"""Deployment: ``agentic-rl export`` (a merged model directory transformers and vLLM load as is) and
``agentic-rl serve`` (an OpenAI-compatible HTTP server with batching). See :mod:`agentic_rl.deploy.export` and
:mod:`agentic_rl.deploy.serve`."""
