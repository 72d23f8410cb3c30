"""One look at a vLLM server's readiness: /health answers 200, /v1/models lists the served name, and one
real completion comes back. Shared by the `vllm_readiness` module (the start-up wait) and the
`deploy_record` module (the unchanged-host check)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def _request(url: str, key: str | None, timeout: float = 5, data: bytes | None = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read()


def look(url: str, name: str, key: str | None, prompt: str = "Hello", max_tokens: int = 4):
    """(stage, detail, completion text or None); stage is down, health, listed or ready."""
    url = url.rstrip("/")
    try:
        st, _ = _request(url + "/health", key)
        if st != 200:
            return "down", f"/health answered {st}", None
    except (urllib.error.URLError, OSError) as e:
        return "down", f"/health: {getattr(e, 'reason', e)}", None
    try:
        st, body = _request(url + "/v1/models", key)
        models = [m.get("id") for m in json.loads(body).get("data", [])]
    except urllib.error.HTTPError as e:
        return "health", f"/v1/models answered {e.code}", None
    except (urllib.error.URLError, OSError, ValueError) as e:
        return "health", f"/v1/models: {e}", None
    if name not in models:
        return "health", f"/v1/models lists {models}, not {name}", None
    body = json.dumps({"model": name, "prompt": prompt, "max_tokens": max_tokens}).encode()
    try:
        st, out = _request(url + "/v1/completions", key, timeout=60, data=body)
        text = json.loads(out)["choices"][0]["text"]
    except urllib.error.HTTPError as e:
        return "listed", f"completion answered {e.code}: {e.read()[:200]!r}", None
    except (urllib.error.URLError, OSError, ValueError, KeyError) as e:
        return "listed", f"completion: {e}", None
    return "ready", "health 200, model listed, completion returned", text
