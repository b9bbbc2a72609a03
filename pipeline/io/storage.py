"""Object-storage roots: `s3://bucket/prefix` and `gs://bucket/prefix`, through obstore.

A root string that names an object store becomes an `ObjectRoot`; any other stays a local
`Path` and keeps the local code path (nothing here is imported by a local build). The
store is obstore's, configured from the standard environment: `AWS_ENDPOINT_URL`,
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION` (and the instance or web-identity
chain) for S3, `GOOGLE_APPLICATION_CREDENTIALS` for GCS. obstore because it is the one
light client that sends the conditional writes a commit needs (`If-None-Match: *` to
create a step's manifest, `If-Match: <etag>` to replace it); pyarrow's filesystems have
none. It is the optional extra `s3` (docs/deploy.md).
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PosixPath
from typing import Any

from pipeline.errors import UsageError

SCHEMES = ("s3://", "gs://")


def is_remote(root: object) -> bool:
    """Whether `root` names an object store (`s3://...`, `gs://...`)."""
    return isinstance(root, ObjectRoot) or (isinstance(root, str) and root.startswith(SCHEMES))


@dataclass(frozen=True)
class ObjectRoot:
    """A root in an object store: `uri` without a trailing slash. Keys are relative to it."""

    uri: str

    def __str__(self) -> str:
        return self.uri

    def url(self, key: str) -> str:
        """The full URL of `key`, as messages name it."""
        return f"{self.uri}/{key}"


def root_of(text: str | Path) -> Path | ObjectRoot:
    """A root given on the command line or in config: an `ObjectRoot` for a store URL, a
    `Path` otherwise. A URL needs a bucket (`s3://bucket` or `s3://bucket/prefix`)."""
    if isinstance(text, Path) or not is_remote(text):
        return Path(text)
    scheme, _, rest = text.partition("://")
    rest = rest.strip("/")
    if not rest:
        raise UsageError(f"{text}: name a bucket ({scheme}://<bucket>/<prefix>)")
    return ObjectRoot(f"{scheme}://{rest}")


class StoreError(OSError):
    """A request to the store failed (network, credentials, a missing bucket): one line."""


# What a client's configuration is read from (obstore's, from the environment): handed to
# the processes that reach the store for a driver (Ray's workers, `ray_ranks.connected`).
CLIENT_ENV = ("AWS_", "GOOGLE_")


def client_environment() -> dict[str, str]:
    """The variables of this environment that configure a store's client."""
    return {name: value for name, value in os.environ.items() if name.startswith(CLIENT_ENV)}


def _store(uri: str) -> Any:
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return _store_at(uri, endpoint)


@functools.cache
def _store_at(uri: str, endpoint: str | None) -> Any:
    """One client per root and endpoint: it holds its connections for the next request."""
    try:
        from obstore.store import from_url
    except ModuleNotFoundError:
        raise UsageError(
            f"{uri}: object-storage roots need obstore: pip install 'rollout-shards[s3]'"
        ) from None
    options: dict[str, Any] = {}
    if uri.startswith("s3://") and endpoint and endpoint.startswith("http://"):
        options["client_options"] = {"allow_http": True}  # a local S3-compatible server
    try:
        return from_url(uri, **options)
    except Exception as exc:  # noqa: BLE001 - obstore's configuration errors, one line
        raise StoreError(f"{uri}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _errors() -> Any:
    import obstore.exceptions

    return obstore.exceptions


def _missing() -> tuple[type[BaseException], ...]:
    """What obstore raises for a missing object (a FileNotFoundError on GET)."""
    return (FileNotFoundError, _errors().NotFoundError)


def _lost() -> tuple[type[BaseException], ...]:
    """What obstore raises when a conditional write's condition fails."""
    return (FileExistsError, _errors().AlreadyExistsError, _errors().PreconditionError)


def _call(root: ObjectRoot, key: str, what: str, request: Any) -> Any:
    """Run `request`, obstore's errors other than the ones the caller expects as one
    StoreError line naming the URL."""
    try:
        return request()
    except _missing() + _lost():
        raise
    except Exception as exc:  # noqa: BLE001 - network, credentials, bucket: one line
        raise StoreError(f"{what} {root.url(key)}: {_first_line(exc)}") from None


@dataclass(frozen=True)
class Stored:
    """An object's bytes and the entity tag they had when read."""

    data: bytes
    etag: str | None


def get(root: ObjectRoot, key: str) -> Stored | None:
    """The object `key` (one GET), or None when there is none."""
    import obstore

    def request() -> Stored:
        result = obstore.get(_store(root.uri), key)
        return Stored(bytes(result.bytes()), result.meta.get("e_tag"))

    try:
        return _call(root, key, "GET", request)  # type: ignore[no-any-return]
    except _missing():
        return None


def put(root: ObjectRoot, key: str, data: bytes) -> None:
    """Write `key` (one PUT, or a multipart upload for a large object)."""
    import obstore

    _call(root, key, "PUT", lambda: obstore.put(_store(root.uri), key, data))


def put_if(root: ObjectRoot, key: str, data: bytes, etag: str | None) -> bool:
    """Write `key` only if it is as the writer last saw it: absent (`etag` None, the
    request carries `If-None-Match: *`) or still that version (`If-Match: <etag>`). False
    when another writer got there first; the store decides, atomically."""
    import obstore

    mode: Any = "create" if etag is None else {"e_tag": etag}
    try:
        _call(root, key, "PUT", lambda: obstore.put(_store(root.uri), key, data, mode=mode))
    except _lost():
        return False
    return True


@dataclass(frozen=True)
class Listed:
    key: str  # relative to the root
    size: int
    modified: datetime
    etag: str | None = None


def listing(root: ObjectRoot, prefix: str) -> list[Listed]:
    """Every object under `prefix` (LIST requests of up to 1000 keys each), sorted by key."""
    import obstore

    def request() -> list[Listed]:
        found = []
        for chunk in obstore.list(_store(root.uri), prefix or None):
            found += [
                Listed(m["path"], m["size"], m["last_modified"], m.get("e_tag")) for m in chunk
            ]
        return sorted(found, key=lambda listed: listed.key)

    return _call(root, prefix, "LIST", request)  # type: ignore[no-any-return]


def head(root: ObjectRoot, key: str) -> Listed | None:
    """The object's size and time of writing (one HEAD), or None when there is none: what a
    file's stat is to the sensor and the schedule."""
    import obstore

    try:
        meta = _call(root, key, "HEAD", lambda: obstore.head(_store(root.uri), key))
    except _missing():
        return None
    return Listed(meta["path"], meta["size"], meta["last_modified"], meta.get("e_tag"))


def head_of(path: ObjectPath) -> Listed | None:
    return head(*split(str(path)))


def check_reachable(root: ObjectRoot, what: str) -> None:
    """One LIST of the root's top level: a missing bucket, a wrong endpoint or refused
    credentials are one usage line before any step is read or written."""
    import obstore

    try:
        obstore.list_with_delimiter(_store(root.uri))
    except Exception as exc:  # noqa: BLE001 - whatever the store says, one line
        raise UsageError(f"{what} {root} cannot be listed: {_first_line(exc)}") from None


def delete(root: ObjectRoot, keys: list[str]) -> None:
    """Remove `keys` (a batch DELETE per 1000 keys on S3); a key already gone is no error."""
    import obstore

    if keys:
        _call(root, keys[0], "DELETE", lambda: obstore.delete(_store(root.uri), keys))


class ObjectPath(PosixPath):
    """An object's URL carried where the readers carry a file's path (`SourceFile.path`):
    its name and suffix are the key's, and it prints as its URL. Never opened as a file:
    the readers fetch it (`fetch`)."""

    def __str__(self) -> str:
        return re.sub(r"^(s3|gs):/(?!/)", r"\1://", super().__str__())

    def __fspath__(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"ObjectPath({str(self)!r})"


def object_path(root: ObjectRoot, key: str) -> ObjectPath:
    return ObjectPath(root.url(key))


def split(url: str) -> tuple[ObjectRoot, str]:
    """An object's URL as its bucket's root and its key."""
    scheme, _, rest = str(url).partition("://")
    bucket, _, key = rest.partition("/")
    return ObjectRoot(f"{scheme}://{bucket}"), key


def fetch(path: ObjectPath) -> bytes:
    """The object's bytes (one GET); FileNotFoundError when there is none."""
    root, key = split(str(path))
    stored = get(root, key)
    if stored is None:
        raise FileNotFoundError(2, "no such object", str(path))
    return stored.data
