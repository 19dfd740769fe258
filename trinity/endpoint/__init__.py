"""An OpenAI-compatible endpoint in front of the rollout engines (`app.py`), the request schema
it accepts (`openai_api.py`), tool-call parsers (`tool_calls.py`) and the server that runs it on
the caller's event loop (`server.py`)."""
