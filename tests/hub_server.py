"""A Hub on localhost for the tests: the part of the Hugging Face Hub's HTTP API that huggingface_hub's
`whoami`, `create_repo`, `upload_folder` and `snapshot_download` speak, kept in memory.

huggingface_hub has no offline or local mode for uploads, so `--push-to-hub` is tested against this server
with ``HF_ENDPOINT`` pointing at it: the real client library, the real requests, a store the test can read.
Every file is accepted as a regular (inline) upload, so no LFS or Xet storage is involved. A model card's
metadata is checked as the Hub checks it before a commit (``/api/validate-yaml``): its YAML must parse.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

import yaml

REPO = r"(?P<repo>[^/]+/[^/]+)"
API = re.compile(rf"^/api/models/{REPO}/(?P<verb>preupload|commit|revision|tree)/(?P<rev>[^/?]+)")
RESOLVE = re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


@dataclass
class Repo:
    private: bool
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)

    @property
    def sha(self) -> str:
        return self.commits[-1] if self.commits else "0" * 40


def blob_id(content: bytes) -> str:
    """Git's blob id of `content`, which the Hub reports as a file's oid and ETag."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


class Hub:
    """The server, on a free port of 127.0.0.1, answering in a background thread until `close`."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.cards: list[dict[str, Any]] = []
        """The metadata of every model card validated, parsed."""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # the test reads `requests`, not stderr
                pass

            def do_POST(self) -> None:
                hub.serve(self, "POST")

            def do_GET(self) -> None:
                hub.serve(self, "GET")

            def do_HEAD(self) -> None:
                hub.serve(self, "HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def serve(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        path = urlparse(handler.path).path
        self.requests.append((method, path))
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        status, headers, payload = self.answer(method, path, body)
        handler.send_response(status)
        for key, value in {"Content-Length": str(len(payload)), **headers}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if method != "HEAD":
            handler.wfile.write(payload)

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if method == "POST" and path == "/api/repos/create":
            request = json.loads(body)
            repo_id = f"{request['organization']}/{request['name']}"
            if repo_id in self.repos:
                return self.json({"error": "You already created this model repo"}, 409)
            self.repos[repo_id] = Repo(private=request.get("visibility") == "private" or bool(request.get("private")))
            return self.json({"url": f"{self.endpoint}/{repo_id}"})
        if method == "GET" and path == "/api/whoami-v2":  # any token is taken: the tests' tokens are all good
            return self.json({"type": "user", "name": "me"})
        if method == "POST" and path == "/api/validate-yaml":
            content = json.loads(body)["content"]
            front = content.split("---")[1] if content.startswith("---") else ""
            try:
                self.cards.append(yaml.safe_load(front) or {})
            except yaml.YAMLError as e:
                return self.json({"errors": [{"message": str(e)}]}, 400)
            return self.json({"warnings": []})
        if match := API.match(path):
            repo = self.repos.get(match["repo"])
            if repo is None:
                return self.json({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
            return getattr(self, match["verb"])(match["repo"], repo, body)
        if (match := RESOLVE.match(path)) and method in ("GET", "HEAD"):
            repo = self.repos.get(match["repo"])
            content = None if repo is None else repo.files.get(unquote(match["path"]))
            if repo is None or content is None:
                return self.json({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"})
            return 200, {"X-Repo-Commit": repo.sha, "ETag": f'"{blob_id(content)}"'}, content
        return self.json({"error": f"not served here: {method} {path}"}, 404)

    def preupload(self, repo_id: str, repo: Repo, body: bytes) -> tuple[int, dict[str, str], bytes]:
        files = json.loads(body)["files"]
        return self.json(
            {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]}
        )

    def commit(self, repo_id: str, repo: Repo, body: bytes) -> tuple[int, dict[str, str], bytes]:
        for line in body.splitlines():
            item = json.loads(line)
            if item["key"] == "file":
                repo.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
        sha = hashlib.sha1(body).hexdigest()
        repo.commits.append(sha)
        return self.json({"commitUrl": f"{self.endpoint}/{repo_id}/commit/{sha}", "commitOid": sha})

    def revision(self, repo_id: str, repo: Repo, body: bytes) -> tuple[int, dict[str, str], bytes]:
        siblings = [{"rfilename": path} for path in sorted(repo.files)]
        return self.json({"id": repo_id, "sha": repo.sha, "private": repo.private, "siblings": siblings})

    def tree(self, repo_id: str, repo: Repo, body: bytes) -> tuple[int, dict[str, str], bytes]:
        return self.json(
            [
                {"type": "file", "path": path, "size": len(content), "oid": blob_id(content)}
                for path, content in sorted(repo.files.items())
            ]
        )

    @staticmethod
    def json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        return status, {"Content-Type": "application/json", **(headers or {})}, json.dumps(data).encode()
