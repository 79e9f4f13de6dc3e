"""The HTTP edge: an OpenAI-compatible ingress (FastAPI under Ray Serve), its request and
response models, the users file, and the request path through the actors (docs/design.md
"Serve runtime")."""
