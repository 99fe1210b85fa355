"""``llmsched data``: lookup order, downloads (checksum, resume) and the never-silent fallback.

Downloads are served by a loopback HTTP server on 127.0.0.1 (a thread in this process); no test
touches the network. ``shared_roots`` is replaced to simulate a clone without ``../shared``.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from pathlib import Path

import pytest

from llmsched_gym import data as D
from llmsched_gym.cli import main
from llmsched_gym.core import workload as W

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


class _Server:
    """Serves ``files`` (URL path -> bytes) with ``Range: bytes=N-`` support. ``cut[path] = K`` makes
    the next response for ``path`` promise the whole body but hang up after K bytes (an interrupted
    download); ``ignore_range`` answers every request with the whole file (200)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.cut: dict[str, int] = {}
        self.ignore_range = False
        self.ranges: list[str | None] = []
        srv = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                body = srv.files.get(self.path)
                rng = self.headers.get("Range")
                srv.ranges.append(rng)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                if rng and not srv.ignore_range:
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    if start >= len(body):
                        self.send_error(416)
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                cut = srv.cut.pop(self.path, None)
                self.wfile.write(part if cut is None else part[:cut])
                self.wfile.flush()
                if cut is not None:
                    self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _toy(monkeypatch, server: _Server, body: bytes, name: str = "toy") -> D.Dataset:
    """Register a small known file served at /toy.csv."""
    server.files["/toy.csv"] = body
    ds = D.Dataset(name, "traces/toy.csv", server.url + "/toy.csv", hashlib.sha256(body).hexdigest(), len(body),
                   "a toy file", "CC0", "nobody")
    monkeypatch.setitem(D.DATASETS, name, ds)
    return ds


BODY = b"arrival_s,prompt_tokens,output_tokens\n" + b"".join(f"{i},{i + 1},{i + 2}\n".encode() for i in range(5000))


# --- download -------------------------------------------------------------------------------------


def test_download_verifies_the_checksum_and_caches(clone, server, monkeypatch):
    _toy(monkeypatch, server, BODY)
    path = D.download("toy")
    assert path == clone / "traces" / "toy.csv" and path.read_bytes() == BODY
    assert not path.with_name("toy.csv.part").exists()
    assert D.resolve_data("toy") == path.resolve()
    D.download("toy")  # already there: not fetched again
    assert len(server.ranges) == 1


def test_a_checksum_mismatch_saves_nothing(clone, server, monkeypatch):
    ds = _toy(monkeypatch, server, BODY)
    server.files["/toy.csv"] = BODY.replace(b"4999,", b"4998,")  # same size, other bytes
    with pytest.raises(D.DataError, match=f"toy: sha256 mismatch .*expected {ds.sha256}.*nothing was saved"):
        D.download("toy")
    assert not (clone / "traces" / "toy.csv").exists()
    assert not (clone / "traces" / "toy.csv.part").exists()
    assert D.resolve_data("toy") is None
    server.files["/toy.csv"] = BODY[:100]  # a complete response, but a shorter file: not resumable
    with pytest.raises(D.DataError, match="toy: sha256 mismatch"):
        D.download("toy")
    assert not (clone / "traces" / "toy.csv.part").exists()


def test_an_interrupted_download_resumes_with_a_range_request(clone, server, monkeypatch):
    _toy(monkeypatch, server, BODY)
    server.cut["/toy.csv"] = 10_000
    with pytest.raises(D.DataError, match="run the same command again to resume"):
        D.download("toy")
    part = clone / "traces" / "toy.csv.part"
    assert part.stat().st_size == 10_000
    said: list[str] = []
    path = D.download("toy", progress=said.append)
    assert server.ranges == [None, "bytes=10000-"]
    assert any("resuming at byte 10,000" in m for m in said)
    assert path.read_bytes() == BODY and not part.exists()


def test_a_server_that_ignores_range_gives_the_whole_file_again(clone, server, monkeypatch):
    _toy(monkeypatch, server, BODY)
    server.cut["/toy.csv"] = 777
    with pytest.raises(D.DataError):
        D.download("toy")
    server.ignore_range = True
    assert D.download("toy").read_bytes() == BODY  # restarted, not appended


def test_download_errors_are_one_line(clone, server, monkeypatch):
    ds = _toy(monkeypatch, server, BODY)
    monkeypatch.setitem(D.DATASETS, "toy", D.Dataset(**{**ds.__dict__, "url": server.url + "/missing.csv"}))
    with pytest.raises(D.DataError, match=r"^toy: download from .*/missing.csv failed: HTTP 404"):
        D.download("toy")
    with pytest.raises(D.DataError, match=r"^data: unknown name 'nope' \(allowed: azure-conv, vtc-arena"):
        D.download("nope")
    monkeypatch.setitem(D.DATASETS, "toy", D.Dataset(**{**ds.__dict__, "url": None, "howto": "ask its authors"}))
    with pytest.raises(D.DataError, match="^toy: no public file to download: ask its authors$"):
        D.download("toy")


# --- lookup ---------------------------------------------------------------------------------------


def test_lookup_order_explicit_then_cache_then_shared(clone, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    (shared / "traces").mkdir(parents=True)
    (shared / "traces" / "AzureLLMInferenceTrace_conv.csv").write_text("shared copy")
    monkeypatch.setattr(D, "shared_roots", lambda: [shared])
    want_shared = (shared / "traces" / "AzureLLMInferenceTrace_conv.csv").resolve()
    assert D.resolve_data("azure-conv") == want_shared
    assert D.resolve_data("AzureLLMInferenceTrace_conv.csv") == want_shared  # the file name is known too
    (clone / "traces").mkdir(parents=True)
    (clone / "traces" / "AzureLLMInferenceTrace_conv.csv").write_text("cached copy")
    assert D.resolve_data("azure-conv") == (clone / "traces" / "AzureLLMInferenceTrace_conv.csv").resolve()
    mine = tmp_path / "mine.csv"
    mine.write_text("x")
    assert D.resolve_data(mine) == mine
    assert D.locate(D.DATASETS["vtc-arena"]) is None and D.resolve_data("vtc-arena") is None


def test_a_missing_explicit_path_is_an_error_even_with_a_known_file_name(clone, monkeypatch):
    monkeypatch.setattr(D, "shared_roots", lambda: [SHARED])
    with pytest.raises(D.DataError, match=r"^/no/such/dir/vtc_arena_real_trace.csv: no such file$"):
        D.resolve_data("/no/such/dir/vtc_arena_real_trace.csv")
    with pytest.raises(D.DataError, match="no-such-trace.csv: no such file"):
        D.resolve_data("no-such-trace.csv")
    with pytest.raises(W.WorkloadError, match="trace.path: /no/such/dir/vtc_arena_real_trace.csv: no such file"):
        W.build_workload({"trace": {"format": "vtc", "path": "/no/such/dir/vtc_arena_real_trace.csv"}}, 0)


def test_the_run_command_rejects_a_mistyped_trace_path_in_one_line(clone, capsys):
    rc = main(["run", "--scenario", "trace:csv:/no/such/dir/vtc_arena_real_trace.csv", "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err == "error: workload.trace.path: /no/such/dir/vtc_arena_real_trace.csv: no such file"


def test_bare_names_are_looked_up_in_llmsched_traces(clone, tmp_path, monkeypatch):
    (tmp_path / "mine.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0,1,1\n")
    monkeypatch.setenv("LLMSCHED_TRACES", str(tmp_path))
    assert D.resolve_data("mine.csv") == tmp_path / "mine.csv"


def test_vidur_profiles_resolve_by_name(clone, tmp_path, monkeypatch):
    f = tmp_path / "shared" / "profiles" / "vidur" / "a100" / "meta-llama" / "Llama-2-7b-hf" / "mlp.csv"
    f.parent.mkdir(parents=True)
    f.write_text("x")
    monkeypatch.setattr(D, "shared_roots", lambda: [tmp_path / "shared"])
    assert D.resolve_data("vidur:a100/llama-2-7b") == f.resolve()
    assert D.resolve_data("vidur:h100/llama-2-7b") is None
    with pytest.raises(D.DataError):
        D.resolve_data("mlp.csv")  # six profiles share the name: only NAME identifies one


# --- the fallback is never silent -----------------------------------------------------------------


def test_missing_trace_falls_back_to_synthetic_and_says_so_once(clone, capsys):
    wl = W.build_workload({"trace": {"format": "azure"}, "n_requests": 50}, 3)
    assert len(wl) == 50 and wl.meta["workload_source"] == {"kind": "synthetic", "name": "azure-conv", "sha256": None}
    W.build_workload({"trace": {"format": "azure"}, "n_requests": 50}, 4)  # an env reset: not said again
    assert capsys.readouterr().err.splitlines() == [
        "azure-conv: real trace not found, using the synthetic stand-in; `llmsched data download azure-conv`"]
    with pytest.raises(W.WorkloadError, match="`llmsched data download azure-conv` fetches it"):
        W.build_workload({"trace": {"format": "azure", "path": "azure-conv"}}, 0)  # asked for by name: no stand-in


def test_generated_workloads_say_generator(clone, tmp_path):
    out = tmp_path / "s.json"
    assert main(["run", "--scenario", "klpm-toy", "--json", str(out), "--quiet"]) == 0
    assert json.loads(out.read_text())["workload_source"] == {"kind": "generator", "name": "klpm-toy", "sha256": None}


@pytest.mark.skipif(not (SHARED / "traces" / "AzureLLMInferenceTrace_conv.csv").is_file(),
                    reason="needs the real Azure trace in ../shared/traces to serve it")
def test_a_fresh_clone_runs_synthetic_then_the_downloaded_real_trace(clone, server, monkeypatch, tmp_path, capsys):
    real = (SHARED / "traces" / "AzureLLMInferenceTrace_conv.csv").read_bytes()
    server.files["/data/AzureLLMInferenceTrace_conv.csv"] = real
    ds = D.DATASETS["azure-conv"]
    monkeypatch.setitem(D.DATASETS, "azure-conv",
                        D.Dataset(**{**ds.__dict__, "url": server.url + "/data/AzureLLMInferenceTrace_conv.csv"}))
    out = tmp_path / "summary.json"
    run = ["run", "--scenario", "azure-conv", "--policy", "fcfs", "--json", str(out)]

    assert main(run) == 0
    cap = capsys.readouterr()
    assert "azure-conv: real trace not found, using the synthetic stand-in; `llmsched data download azure-conv`" \
        in cap.err.splitlines()
    assert "synthetic stand-in for azure-conv" in cap.out  # the printed table's title
    assert json.loads(out.read_text())["workload_source"]["kind"] == "synthetic"

    assert main(["data", "path", "azure-conv"]) == 1
    assert main(["data", "download", "azure-conv"]) == 0
    assert main(["data", "path", "azure-conv"]) == 0
    assert capsys.readouterr().out.strip().endswith(str(clone / "traces" / "AzureLLMInferenceTrace_conv.csv"))

    assert main(run) == 0
    cap = capsys.readouterr()
    assert "synthetic" not in cap.err + cap.out
    s = json.loads(out.read_text())
    assert s["workload_source"] == {"kind": "trace", "name": "azure-conv", "sha256": ds.sha256}
    assert s["n_arrived"] == 19_366


def test_data_list_shows_every_known_file(clone, capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    for ds in D.DATASETS.values():
        assert f"{ds.name}  {ds.size:,} bytes  not present" in out and ds.sha256 in out
    assert "licence: CC-BY-4.0; cite: Patel et al. 2024" in out


def test_the_compare_report_says_synthetic(clone, tmp_path):
    from agents.evaluate import compare

    compare("azure-conv", [0], [1.0], ["fcfs"], [], {"workload.n_requests": 30}, None, tmp_path / "cmp",
            plots=False, quiet=True)
    title = (tmp_path / "cmp" / "report.md").read_text().splitlines()[0]
    assert title == "# azure-conv (synthetic stand-in for azure-conv): policies on identical seeded workloads"
    src = {"kind": "synthetic", "name": "azure-conv", "sha256": None}
    assert D.synthetic_note(src) == " (synthetic stand-in for azure-conv)"
    assert D.synthetic_note({"kind": "trace", "name": "azure-conv", "sha256": "x"}) == ""
