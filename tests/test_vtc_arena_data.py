"""``llmsched data download vtc-arena``: the CSV is built from the VTC artifact's JSON results
(served here by a loopback HTTP server: no network), never from its pickle."""

from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path

import pytest
from test_data import _Server

from llmsched_gym import data as D
from llmsched_gym.cli import main

SHARED_CSV = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "vtc_arena_real_trace.csv"


def results_jsonl(rows: list[tuple[float, int, int, int]]) -> bytes:
    """The artifact's layout: one JSON line, ``result.responses`` one record per request."""
    responses = [{"adapter_dir": f"dummy-lora-7b-rank-8-{c}", "prompt_len": p, "output_len": o,
                  "request_latency": 1.0, "first_token_latency": 0.1, "req_time": t} for t, c, p, o in rows]
    record = {"config": {"mode": "real", "duration": 600}, "result": {"num_abort": 0, "responses": responses}}
    return (json.dumps(record) + "\n").encode()


def _serve_as_vtc_arena(monkeypatch, server: _Server, body: bytes) -> D.Dataset:
    server.files["/all_results_real.jsonl"] = body
    ds = D.DATASETS["vtc-arena"]
    patched = D.Dataset(**{**ds.__dict__, "url": server.url + "/all_results_real.jsonl",
                           "source_sha256": hashlib.sha256(body).hexdigest(), "source_size": len(body)})
    monkeypatch.setitem(D.DATASETS, "vtc-arena", patched)
    return patched


def test_the_csv_is_built_row_by_row_from_the_json_results():
    rows = [(0.0, 13, 13, 199), (0.20793754160099873, 2, 36, 137), (1.5, 0, 456, 1)]
    assert D.vtc_arena_csv(results_jsonl(rows)) == (
        b"arrival_s,client,prompt_tokens,output_tokens\r\n0.000000,13,13,199\r\n0.207938,2,36,137\r\n"
        b"1.500000,0,456,1\r\n")


@pytest.mark.skipif(not SHARED_CSV.is_file(), reason="needs ../shared/traces/vtc_arena_real_trace.csv")
def test_download_builds_the_published_csv_bit_for_bit(clone, server, monkeypatch, capsys):
    # the published CSV's rows, laid out as the artifact's results file: the CSV built from them
    # must have the known sha256 (the real file is built the same way from the real results)
    lines = SHARED_CSV.read_bytes().decode().split("\r\n")[1:-1]
    rows = [(float(t), int(c), int(p), int(o)) for t, c, p, o in (x.split(",") for x in lines)]
    _serve_as_vtc_arena(monkeypatch, server, results_jsonl(rows))
    assert main(["data", "download", "vtc-arena"]) == 0
    path = clone / "traces" / "vtc_arena_real_trace.csv"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == D.DATASETS["vtc-arena"].sha256
    assert path.read_bytes() == SHARED_CSV.read_bytes()
    assert "built from" in capsys.readouterr().out
    assert main(["run", "--scenario", "vtc-arena", "--quiet", "--json", str(clone / "s.json")]) == 0
    src = json.loads((clone / "s.json").read_text())["workload_source"]
    assert src == {"kind": "trace", "name": "vtc-arena", "sha256": D.DATASETS["vtc-arena"].sha256}


def test_results_that_do_not_build_the_known_csv_save_nothing(clone, server, monkeypatch):
    _serve_as_vtc_arena(monkeypatch, server, results_jsonl([(0.0, 1, 2, 3)]))
    with pytest.raises(D.DataError, match="vtc-arena: the file built from .* does not match the known sha256"):
        D.download("vtc-arena")
    assert not any((clone / "traces").iterdir())


def test_a_pickle_is_never_unpickled(clone, server, monkeypatch, tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    blob = pickle.dumps(Payload())
    with pytest.raises(D.DataError, match="^vtc-arena: not the VTC artifact's all_results_real.jsonl"):
        D.vtc_arena_csv(blob)
    _serve_as_vtc_arena(monkeypatch, server, blob)  # even served as the source, with its own checksum
    with pytest.raises(D.DataError, match="^vtc-arena: not the VTC artifact's all_results_real.jsonl"):
        D.download("vtc-arena")
    assert not marker.exists()


def test_data_list_and_download_all_include_vtc_arena(clone, capsys):
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "source: built from https://raw.githubusercontent.com/Ying1123/VTC-artifact/192c2e2" in out
    assert "real_trace.pkl is never read" in out
