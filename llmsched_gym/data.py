"""Public data the simulator can use but the repository does not ship: real traces and GPU profiles.

``llmsched data list`` shows the known files (source, licence, citation, size, sha256, and where
each one is found locally); ``llmsched data download NAME|all`` fetches them from their
publishers into a user cache, checks the sha256 and resumes an interrupted download (HTTP
``Range``); ``llmsched data path NAME`` prints where a file is read from.

The cache is ``$LLMSCHED_DATA`` if set, else the platform's cache folder: ``~/.cache/llmsched-gym``
(or ``$XDG_CACHE_HOME/llmsched-gym``) on Linux, ``~/Library/Caches/llmsched-gym`` on macOS,
``%LOCALAPPDATA%\\llmsched-gym\\Cache`` on Windows.

Lookup (:func:`resolve_data`), first hit wins:

1. an explicit path (absolute, relative, or a file in the current directory);
2. for a bare file name: ``$LLMSCHED_TRACES/NAME``;
3. for a known name (``azure-conv``, its file name ``AzureLLMInferenceTrace_conv.csv``,
   ``vidur:a100/llama-2-7b``, ...): the cache, then ``../shared/`` next to the repository (this
   project's development layout).

A path with a folder that does not exist is an error; a known name found nowhere gives ``None``,
and the scenarios then run on a synthetic stand-in and say so (one line on stderr, and
``workload_source`` in the summary).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llmsched_gym.config import ConfigError


class DataError(ConfigError):
    """A data name, path or download failed; the message is one line naming what and why."""


@dataclass(frozen=True)
class Dataset:
    """One known file.

    :ivar name: the name ``llmsched data`` and scenarios use (``azure-conv``).
    :ivar relpath: where it lives inside the cache (and inside ``../shared/``).
    :ivar url: the publisher's public URL, or ``None`` when there is no file to download.
    :ivar sha256: checksum of the expected file.
    :ivar size: size in bytes.
    :ivar description: what it is and who publishes it.
    :ivar licence: the publisher's licence.
    :ivar citation: what to cite when you use it.
    :ivar howto: for files without a URL, how to get one.
    :ivar derive: for a file built from the publisher's file rather than downloaded as is: the
        name of its converter in :data:`DERIVERS`; ``url`` then points at the publisher's file,
        whose own checksum and size are ``source_sha256`` and ``source_size``.
    """

    name: str
    relpath: str
    url: str | None
    sha256: str
    size: int
    description: str
    licence: str
    citation: str
    howto: str = ""
    derive: str | None = None
    source_sha256: str | None = None
    source_size: int | None = None

    @property
    def filename(self) -> str:
        return Path(self.relpath).name


_VTC_URL = ("https://raw.githubusercontent.com/Ying1123/VTC-artifact/192c2e2014c69c8c6c699d7113c3822e4db632e6/"
            "fair_bench/FCFS/all_results_real.jsonl")
_AZURE_URL = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/AzureLLMInferenceTrace_conv.csv"
_MOONCAKE_URL = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/a2a4b18ac537fd798d50e6e9f57031ce86419a37/"
                 "FAST25-release/traces/conversation_trace.jsonl")
_VIDUR_URL = "https://raw.githubusercontent.com/microsoft/vidur/7d47513/data/profiling/compute/"
_VIDUR = (  # name suffix, folder under data/profiling/compute/, sha256, size (Vidur commit 7d47513)
    ("a100/llama-2-7b", "a100/meta-llama/Llama-2-7b-hf",
     "2cfacca979f32e83257753cf6fd815a71af8ba9a7a9d0643b18d9f54e8a37688", 706_614),
    ("a100/llama-2-70b", "a100/meta-llama/Llama-2-70b-hf",
     "d690ce601f94ab80586e1d5a6a92ea0d64114dc3e0895bf32b3bee270f3d9b7f", 688_286),
    ("a100/llama-3-8b", "a100/meta-llama/Meta-Llama-3-8B",
     "98c26488298e324e89db7349e213f75c856ae83dc6b17548a68636d2cb5efff0", 1_204_856),
    ("h100/llama-2-7b", "h100/meta-llama/Llama-2-7b-hf",
     "b1a2def08857d10e5f66c3b5b2d046b6e8caed5c30b2bc920a0462598e3b2a59", 715_469),
    ("h100/llama-2-70b", "h100/meta-llama/Llama-2-70b-hf",
     "fb3581ade7c02caab8a0f7d1ca1ad06a7b0fbac3d9f32a9ed46ae55d95fd6bb3", 691_493),
    ("a40/llama-2-7b", "a40/meta-llama/Llama-2-7b-hf",
     "f8d0f455d0b72b7975be0ed8e1951dcbf2eabc083001b27f6ef8203c0a96962c", 689_225),
)

DATASETS: dict[str, Dataset] = {
    "azure-conv": Dataset(
        "azure-conv", "traces/AzureLLMInferenceTrace_conv.csv", _AZURE_URL,
        "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8", 719_188,
        "Azure LLM inference trace 2023, conversation service: 19,366 requests over about 1 h "
        "(github.com/Azure/AzurePublicDataset, data/AzureLLMInferenceTrace_conv.csv)",
        "CC-BY-4.0",
        "Patel et al. 2024, \"Splitwise: Efficient generative LLM inference using phase splitting\", ISCA 2024"),
    "vtc-arena": Dataset(
        "vtc-arena", "traces/vtc_arena_real_trace.csv", _VTC_URL,
        "e1bdf401d85997a3167af7512359d177d71f0e276c27b3a4a2fac6fcb3afe67d", 31_511,
        "The 27-client Chatbot Arena trace of the VTC paper: 1,500 requests over 600 s, built from the "
        "per-request results of its real-trace run in github.com/Ying1123/VTC-artifact "
        "(fair_bench/FCFS/all_results_real.jsonl, JSON; the artifact's real_trace.pkl is never read)",
        "Apache-2.0 (the artifact)",
        "Sheng et al. 2024, \"Fairness in Serving Large Language Models\", OSDI 2024",
        derive="vtc-results",
        source_sha256="21cd8b32e861bef81de244744487e9d051fa82d2d047cc03333890052565dd3f", source_size=288_910),
    "mooncake-conv": Dataset(
        "mooncake-conv", "traces/mooncake_conversation_trace.jsonl", _MOONCAKE_URL,
        "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df", 3_029_533,
        "Mooncake (Kimi) conversation trace: 12,031 requests over 59 min, one JSON object a line with "
        "timestamp (ms), input_length, output_length and hash_ids (the prompt's 512-token prefix blocks) "
        "(github.com/kvcache-ai/Mooncake, FAST25-release/traces/conversation_trace.jsonl)",
        "Apache-2.0",
        "Qin et al. 2025, \"Mooncake: Trading More Storage for Less Computation - A KVCache-centric "
        "Architecture for Serving LLM Chatbot\", FAST 2025"),
    **{f"vidur:{short}": Dataset(
        f"vidur:{short}", f"profiles/vidur/{folder}/mlp.csv", f"{_VIDUR_URL}{folder}/mlp.csv", sha, size,
        f"Vidur's measured per-layer operator timings (non-attention) for {folder.split('/')[-1]} on "
        f"{folder.split('/')[0].upper()} (github.com/microsoft/vidur, data/profiling/compute)",
        "MIT (Microsoft Corporation)",
        "Agrawal et al. 2024, \"Vidur: A Large-Scale Simulation Framework for LLM Inference\", MLSys 2024")
       for short, folder, sha, size in _VIDUR},
}
"""The known files, by name."""


def vtc_arena_csv(results: bytes) -> bytes:
    """The ``vtc-arena`` CSV from the VTC artifact's per-request results of its real-trace run
    (``fair_bench/FCFS/all_results_real.jsonl``, commit 192c2e2): JSON, read with ``json.loads``,
    so nothing in the file can run. One row per response, in the file's (arrival) order:
    ``req_time`` as ``arrival_s`` (6 decimals), the number that ends its LoRA ``adapter_dir``
    (``dummy-lora-7b-rank-8-13`` is client 13) as ``client``, ``prompt_len`` and ``output_len``;
    CRLF line ends, as the published CSV has them. The artifact also ships the trace as a Python
    pickle (``fair_bench/real_trace.pkl``); unpickling runs whatever code the file carries, so it
    is not used.

    :raises DataError: a file of another shape (one line naming what is wrong).
    """
    import json

    try:
        record = json.loads(results.decode("utf-8").splitlines()[0])
        rows = [(float(r["req_time"]), int(str(r["adapter_dir"]).rsplit("-", 1)[1]), int(r["prompt_len"]),
                 int(r["output_len"])) for r in record["result"]["responses"]]
    except (UnicodeDecodeError, IndexError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DataError(f"vtc-arena: not the VTC artifact's all_results_real.jsonl ({type(e).__name__}: {e})") from None
    lines = ["arrival_s,client,prompt_tokens,output_tokens"] + [f"{t:.6f},{c},{p},{o}" for t, c, p, o in rows]
    return ("\r\n".join(lines) + "\r\n").encode()


DERIVERS: dict[str, Callable[[bytes], bytes]] = {"vtc-results": vtc_arena_csv}
"""Converters from a publisher's file to the known file (:attr:`Dataset.derive`)."""


def data_dir() -> Path:
    """The user cache: ``$LLMSCHED_DATA``, else the platform cache folder (see the module docstring)."""
    if os.environ.get("LLMSCHED_DATA"):
        return Path(os.environ["LLMSCHED_DATA"]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "llmsched-gym" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "llmsched-gym"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llmsched-gym"


def shared_roots() -> list[Path]:
    """``../shared`` next to the repository checkout and next to the current directory: where this
    project's development copies live. Tests replace this function to simulate a plain clone."""
    return [Path(__file__).resolve().parents[1].parent / "shared", Path.cwd().parent / "shared"]


def known(name: str) -> Dataset | None:
    """The dataset called ``name``, or whose file name is ``name`` (the Vidur profiles share one
    file name, so they are known by name only); ``None`` otherwise."""
    if name in DATASETS:
        return DATASETS[name]
    hits = [d for d in DATASETS.values() if d.filename == name]
    return hits[0] if len(hits) == 1 else None


def get_dataset(name: str) -> Dataset:
    """The known file ``name`` (a name or its file name); a :class:`DataError` naming the allowed
    names otherwise."""
    ds = known(name)
    if ds is None:
        raise DataError(f"data: unknown name {name!r} (allowed: {', '.join(DATASETS)})")
    return ds


def locate(ds: Dataset) -> tuple[Path, str] | None:
    """Where a known file is found locally, and which place that is (``cache`` or ``shared``)."""
    for where, path in [("cache", data_dir() / ds.relpath)] + [("shared", r / ds.relpath) for r in shared_roots()]:
        if path.is_file():
            return path.resolve(), where
    return None


def resolve_data(name: str | os.PathLike) -> Path | None:
    """The local file for ``name``: an explicit path, ``$LLMSCHED_TRACES/NAME`` for a bare name, then
    for a known name (``azure-conv``, ``AzureLLMInferenceTrace_conv.csv``, ``vidur:a100/llama-2-7b``)
    the cache and ``../shared``.

    :returns: the path, or ``None`` when ``name`` is known but not present anywhere (the caller
        decides whether a synthetic stand-in applies).
    :raises DataError: when ``name`` is neither an existing path nor a known name (one line).
    """
    text = os.fspath(name)
    ds = DATASETS.get(text)
    if ds is None:
        path = Path(text).expanduser()
        if path.is_file():
            return path
        bare = path.name == text
        if bare and os.environ.get("LLMSCHED_TRACES"):
            candidate = Path(os.environ["LLMSCHED_TRACES"]) / text
            if candidate.is_file():
                return candidate
        ds = known(text) if bare else None
        if ds is None:
            raise DataError(f"{text}: no such file")
    found = locate(ds)
    return None if found is None else found[0]


_HASHES: dict[tuple[str, int, int], str] = {}


def sha256_of(path: str | os.PathLike) -> str:
    """The file's sha256 (hex), remembered per (path, size, mtime) so repeated runs hash it once."""
    p = Path(path).resolve()
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        _HASHES[key] = _hash(p)
    return _HASHES[key]


def _hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def download(name: str, *, url: str | None = None, progress: Callable[[str], None] | None = None,
             timeout_s: float = 60.0) -> Path:
    """Fetch ``name`` into the cache, verified against its sha256, and return its path.

    A file already in the cache with the right checksum is not fetched again. The bytes go to
    ``FILE.part`` first; an interrupted download keeps it and the next call asks the server for
    the rest (``Range: bytes=N-``; a server that ignores it sends the whole file, which is fine).
    The file appears under its name only once its sha256 matches. A derived file (``vtc-arena``)
    is built from the publisher's file once that file's own sha256 matches, and checked again.

    :param url: fetch from here instead of the publisher (a mirror, or ``file:///...``): the known
        file itself or, for a derived one, the publisher's file it is built from.
    :raises DataError: unknown name, no URL, network failure (the partial file is kept), or a
        checksum mismatch (the partial file is deleted: it cannot be resumed into the right file).
    """
    ds = get_dataset(name)
    say = progress or (lambda _m: None)
    src = url or ds.url
    if src is None:
        raise DataError(f"{ds.name}: no public file to download: {ds.howto}")
    target = data_dir() / ds.relpath
    if target.is_file() and _hash(target) == ds.sha256:
        say(f"{ds.name}: already in the cache ({target})")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    have = part.stat().st_size if part.is_file() else 0
    cut_short = False  # the server promised more bytes (Content-Length) than arrived
    if have not in (ds.size, ds.source_size):
        import http.client  # here, not at the top: they cost ~40 ms of every `llmsched` start
        import urllib.error
        import urllib.request

        request = urllib.request.Request(src, headers={"User-Agent": "llmsched-gym"})
        if have:
            request.add_header("Range", f"bytes={have}-")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as resp:
                resumed = have > 0 and getattr(resp, "status", None) == 206
                say(f"{ds.name}: {'resuming at byte ' + format(have, ',') if resumed else 'downloading'} from {src}")
                promised, received = resp.headers.get("Content-Length"), 0
                with part.open("ab" if resumed else "wb") as f:
                    for chunk in iter(lambda: resp.read(1 << 16), b""):
                        f.write(chunk)
                        received += len(chunk)
                # http.client does not always raise when the connection ends early
                cut_short = promised is not None and promised.isdigit() and received < int(promised)
        except urllib.error.HTTPError as e:
            if not (e.code == 416 and have):  # 416: nothing left to send, the part file is whole
                raise DataError(f"{ds.name}: download from {src} failed: HTTP {e.code} {e.reason}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:  # incl. a dropped connection
            reason = getattr(e, "reason", e)
            raise DataError(f"{ds.name}: download from {src} failed ({reason}); "
                            f"run the same command again to resume") from None
    if cut_short:
        raise DataError(f"{ds.name}: download from {src} stopped at byte {part.stat().st_size:,}, before the "
                        "end the server announced; run the same command again to resume")
    got = _hash(part)  # never the remembered hash: the part file changes in place
    if ds.derive is not None and got == ds.source_sha256:
        built = DERIVERS[ds.derive](part.read_bytes())
        if hashlib.sha256(built).hexdigest() != ds.sha256:
            part.unlink()
            raise DataError(f"{ds.name}: the file built from {src} does not match the known sha256 {ds.sha256}; "
                            "nothing was saved")
        part.write_bytes(built)
        say(f"{ds.name}: built from {src} (the publisher's JSON results; no pickle is read)")
        got = ds.sha256
    if got != ds.sha256:
        part.unlink()
        also = f" or, to build it from, {ds.source_sha256}" if ds.derive else ""
        raise DataError(f"{ds.name}: sha256 mismatch (got {got}, expected {ds.sha256}{also}): the file at {src} "
                        "is not the known one; nothing was saved")
    os.replace(part, target)
    say(f"{ds.name}: saved {target} ({ds.size:,} bytes, sha256 verified)")
    return target


_NOTIFIED: set[str] = set()


def notify_fallback(name: str) -> None:
    """Say once per process, on stderr, that ``name``'s real file is missing and a synthetic
    stand-in runs instead (env resets rebuild the workload every episode: one line, not one each)."""
    if name not in _NOTIFIED:
        _NOTIFIED.add(name)
        print(f"{name}: real trace not found, using the synthetic stand-in; `llmsched data download {name}`",
              file=sys.stderr)


def trace_source(path: Path, ds: Dataset | None) -> dict:
    """A trace file's ``workload_source``: ``{"kind": "trace", "name", "sha256"}``.

    A file found under a known name (in the cache, ``../shared`` or ``$LLMSCHED_TRACES``, where
    anyone may have put it by hand) is checked against the known sha256. On a mismatch it still
    runs, as given, but the source says ``"verified": false`` with the ``expected_sha256``, the
    titles say "not the published NAME", and one line on stderr says so (once per file).
    """
    got = sha256_of(path)
    if ds is None:
        return {"kind": "trace", "name": str(path), "sha256": got}
    if got == ds.sha256:
        return {"kind": "trace", "name": ds.name, "sha256": got}
    if str(path) not in _NOTIFIED:
        _NOTIFIED.add(str(path))
        print(f"{ds.name}: {path} is not the published file (sha256 {got[:12]}..., expected {ds.sha256[:12]}...); "
              f"running it as given (workload_source says so); `llmsched data download {ds.name}` fetches the "
              "published one", file=sys.stderr)
    return {"kind": "trace", "name": ds.name, "sha256": got, "verified": False, "expected_sha256": ds.sha256}


def synthetic_note(source: dict | None) -> str:
    """`` (synthetic stand-in for NAME)`` when a summary's ``workload_source`` is a stand-in,
    `` (not the published NAME: sha256 mismatch)`` for a hand-placed file that failed its
    checksum, else ``""``: reports and console tables append it to their titles, so neither passes
    for the real trace."""
    if source and source.get("kind") == "synthetic":
        return f" (synthetic stand-in for {source['name']})"
    if source and source.get("verified") is False:
        return f" (not the published {source['name']}: sha256 mismatch)"
    return ""
