"""The Redis backend: every change is one Lua script, so it is atomic on the server.

Key layout (``P`` = the key prefix, ``N`` = 32 hex digits of the namespace key)::

    P:meta            hash    store id
    P:codecs          hash    codec index -> identity description (JSON), stored once
    P:codecidx        hash    codec digest -> codec index
    P:N:id            string  span id counter (INCR: ids only grow)
    P:N:s:<id>        string  span record (``seqkv.store.record``)
    P:N:c             hash    span id -> reference count
    P:N:n             hash    session id -> "<span>:<length>"
    P:N:i:<hh>        hash    index bucket: key bytes [2:] -> span id; <hh> = hex of bytes [:2]
    P:N:d:<digest>    string  a mixing dictionary's bytes (``seqkv.mixing``), by its digest
    P:N:dcur          string  the digest of the namespace's current dictionary
    P:N:sd            hash    span id -> digest of the dictionary it was coded with (if any)

Motivation for the buckets: 65,536 small hashes keep the index in Redis' compact listpack encoding
(a few bytes per entry) where one big hash or one key per entry costs ~50-70 bytes per entry; a
lookup is still one pipelined request of HGETs.

Invariants:
1. Reference counts change only inside the commit, delete and gc scripts, each atomic on the
   server (enforced); ``commit`` checks the session and the parent before it writes anything.
2. With ``appendfsync always`` a command is on disk before its reply, so an acknowledged put
   survives ``kill -9`` of redis-server (assumed of Redis; fault-tested).
3. Scripts touch keys they compute from their arguments (the new span's key depends on INCR), so
   the backend needs a single Redis server, not a cluster (assumed; stated in the docs).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from seqkv.formats.span import read_frame
from seqkv.store.backends.base import (
    AuditReport,
    ByteCounts,
    CodecIdentity,
    CommitPlan,
    DictionaryGoneError,
    GcReport,
    IdentityCache,
    ParentGoneError,
    SessionChain,
    SessionEntry,
    StoredSpan,
)
from seqkv.store.errors import (
    ConcurrentUpdateError,
    CorruptRecordError,
    SessionExistsError,
    StoreUnavailableError,
)
from seqkv.store.ids import NamespaceKey, SessionName, SpanId

_LIB = """
local function varint(s, pos)
  local v, mul = 0, 1
  while true do
    local b = string.byte(s, pos)
    pos = pos + 1
    v = v + (b % 128) * mul
    if b < 128 then return v, pos end
    mul = mul * 128
  end
end
local function parent_of(rec)
  local _, pos = varint(rec, 2)
  local parent = varint(rec, pos)
  if parent == 0 then return nil end
  return string.format('%d', parent)
end
local function release(p, span)
  local ckey = p .. ':c'
  while span do
    local n = redis.call('HINCRBY', ckey, span, -1)
    if n > 0 then return end
    local skey = p .. ':s:' .. span
    local rec = redis.call('GET', skey)
    redis.call('DEL', skey)
    redis.call('HDEL', ckey, span)
    redis.call('HDEL', p .. ':sd', span)
    if rec then span = parent_of(rec) else span = nil end
  end
end
local function chain(p, span, out, seen)
  while span and not seen[span] do
    local rec = redis.call('GET', p .. ':s:' .. span)
    if not rec then return false end
    seen[span] = true
    table.insert(out, span)
    table.insert(out, rec)
    span = parent_of(rec)
  end
  return true
end
"""

_COMMIT = _LIB + """
local p, name, length, expect, record, parent = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local dict = ARGV[7]
local ckey, nkey = p .. ':c', p .. ':n'
local current = redis.call('HGET', nkey, name)
if expect == '' then
  if current then return 'exists' end
elseif current ~= expect then
  return 'changed'
end
if parent ~= '' and not redis.call('HGET', ckey, parent) then return 'gone' end
if record ~= '' and dict ~= '' and redis.call('EXISTS', p .. ':d:' .. dict) == 0 then
  return 'nodict'
end
local span = parent
if record ~= '' then
  span = tostring(redis.call('INCR', p .. ':id'))
  redis.call('SET', p .. ':s:' .. span, record)
  redis.call('HSET', ckey, span, 0)
  if dict ~= '' then redis.call('HSET', p .. ':sd', span, dict) end
  if parent ~= '' then redis.call('HINCRBY', ckey, parent, 1) end
  for i = 8, #ARGV, 2 do
    local old = redis.call('HGET', ARGV[i], ARGV[i + 1])
    if (not old) or redis.call('HEXISTS', ckey, old) == 0 then
      redis.call('HSET', ARGV[i], ARGV[i + 1], span)
    end
  end
end
redis.call('HINCRBY', ckey, span, 1)
redis.call('HSET', nkey, name, span .. ':' .. length)
if current then release(p, string.match(current, '^(%d+):')) end
return 'ok:' .. span
"""

_DELETE = _LIB + """
local p, name = ARGV[1], ARGV[2]
local current = redis.call('HGET', p .. ':n', name)
if not current then return 0 end
redis.call('HDEL', p .. ':n', name)
release(p, string.match(current, '^(%d+):'))
return 1
"""

_FETCH_SPAN = _LIB + """
local out = {}
if not chain(ARGV[1], ARGV[2], out, {}) then return false end
return out
"""

_FETCH_SESSIONS = _LIB + """
local p = ARGV[1]
local entries, out, seen = {}, {}, {}
for i = 2, #ARGV do
  local entry = redis.call('HGET', p .. ':n', ARGV[i])
  if entry then
    if not chain(p, string.match(entry, '^(%d+):'), out, seen) then
      return redis.error_reply('SKV a session references a missing span record')
    end
    table.insert(entries, entry)
  else
    table.insert(entries, '')
  end
end
return {entries, out}
"""

# Mark (from the sessions, through parents) and sweep; with ARGV[2] == '1' also repair.
_AUDIT = _LIB + """
local p, fix = ARGV[1], ARGV[2] == '1'
local ckey, nkey = p .. ':c', p .. ':n'
local records, stored, counts, reachable = {}, {}, {}, {}
local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':s:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    records[string.sub(key, #p + 4)] = parent_of(redis.call('GET', key)) or ''
  end
until cursor == '0'
local flat = redis.call('HGETALL', ckey)
for i = 1, #flat, 2 do stored[flat[i]] = tonumber(flat[i + 1]) end
local sessions = redis.call('HGETALL', nkey)
for i = 2, #sessions, 2 do
  local span = string.match(sessions[i], '^(%d+):')
  counts[span] = (counts[span] or 0) + 1
  while span and records[span] and not reachable[span] do
    reachable[span] = true
    local parent = records[span]
    if parent == '' then span = nil else
      counts[parent] = (counts[parent] or 0) + 1
      span = parent
    end
  end
end
local mismatches, missing, orphans, nspans, fixed, removed = 0, 0, 0, 0, 0, 0
for span, n in pairs(stored) do
  nspans = nspans + 1
  if not records[span] then missing = missing + 1 end
  if (counts[span] or 0) ~= n then
    mismatches = mismatches + 1
    if fix and reachable[span] then
      redis.call('HSET', ckey, span, counts[span])
      fixed = fixed + 1
    end
  end
end
for span, _ in pairs(records) do
  if stored[span] == nil then orphans = orphans + 1 end
  if fix and not reachable[span] then
    redis.call('DEL', p .. ':s:' .. span)
    removed = removed + 1
  end
end
if fix then
  for span, _ in pairs(stored) do
    if not reachable[span] then redis.call('HDEL', ckey, span) end
  end
end
local entries, dangling = 0, 0
cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':i:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    local kv = redis.call('HGETALL', key)
    for i = 1, #kv, 2 do
      entries = entries + 1
      if not reachable[kv[i + 1]] then
        dangling = dangling + 1
        if fix then redis.call('HDEL', key, kv[i]) end
      end
    end
  end
until cursor == '0'
local sdkey, current = p .. ':sd', redis.call('GET', p .. ':dcur')
local referenced, ndicts, missing_dicts, dicts_removed = {}, 0, 0, 0
flat = redis.call('HGETALL', sdkey)
for i = 1, #flat, 2 do
  if reachable[flat[i]] then
    referenced[flat[i + 1]] = true
    if redis.call('EXISTS', p .. ':d:' .. flat[i + 1]) == 0 then
      missing_dicts = missing_dicts + 1
    end
  elseif fix then
    redis.call('HDEL', sdkey, flat[i])
  end
end
cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':d:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    ndicts = ndicts + 1
    local digest = string.sub(key, #p + 4)
    if fix and not referenced[digest] and digest ~= current then
      redis.call('DEL', key)
      dicts_removed = dicts_removed + 1
    end
  end
until cursor == '0'
return {#sessions / 2, nspans, mismatches, missing, orphans, dangling, entries, fixed, removed,
        ndicts, missing_dicts, dicts_removed}
"""

_BYTES = """
local p = ARGV[1]
local records, nrecords, index, nindex, sessions, ids, counts = 0, 0, 0, 0, 0, 0, 0
local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':s:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    records = records + redis.call('STRLEN', key)
    nrecords = nrecords + 1
  end
until cursor == '0'
cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':i:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    local kv = redis.call('HGETALL', key)
    for i = 1, #kv, 2 do
      index = index + 2 + #kv[i] + #kv[i + 1]
      nindex = nindex + 1
    end
  end
until cursor == '0'
local kv = redis.call('HGETALL', p .. ':n')
for i = 1, #kv, 2 do
  sessions = sessions + #kv[i] + #kv[i + 1]
  ids = ids + #kv[i]
end
kv = redis.call('HGETALL', p .. ':c')
for i = 1, #kv, 2 do counts = counts + #kv[i] + #kv[i + 1] end
local dicts = 0
cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':d:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do dicts = dicts + redis.call('STRLEN', key) end
until cursor == '0'
return {records, nrecords, index, nindex, sessions, ids, counts, dicts}
"""

_PUT_DICTIONARY = """
local created = redis.call('SETNX', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return created
"""

_REGISTER = """
local idx = redis.call('HGET', KEYS[2], ARGV[1])
if idx then return idx end
idx = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[2], ARGV[1], idx)
redis.call('HSET', KEYS[1], idx, ARGV[2])
return idx
"""


class RedisBackend:
    """``StoreBackend`` on one Redis server (``redis://host:port/db``)."""

    def __init__(self, url: str, prefix: str = "skv") -> None:
        self._client: Any = redis.Redis.from_url(url, socket_connect_timeout=5,
                                                 socket_timeout=120)
        self._url = url
        self._prefix = prefix
        self._trips = 0
        try:
            self._client.ping()
        except redis.RedisError as error:
            raise StoreUnavailableError(f"cannot reach Redis at {url}: {error}") from error
        self._scripts = {
            name: self._client.register_script(source)
            for name, source in (("commit", _COMMIT), ("delete", _DELETE),
                                 ("span", _FETCH_SPAN), ("sessions", _FETCH_SESSIONS),
                                 ("audit", _AUDIT), ("bytes", _BYTES), ("register", _REGISTER),
                                 ("dictionary", _PUT_DICTIONARY))
        }
        self._cache = IdentityCache()

    @property
    def url(self) -> str:
        return self._url

    @property
    def client(self) -> Any:
        return self._client

    @property
    def round_trips(self) -> int:
        return self._trips

    def _ns(self, ns: NamespaceKey) -> str:
        return f"{self._prefix}:{ns.hex()}"

    @contextmanager
    def _request(self) -> Iterator[None]:
        """Count one round trip; a lost or loading server becomes StoreUnavailableError."""
        self._trips += 1
        try:
            yield
        except (redis.ConnectionError, redis.TimeoutError) as error:
            raise StoreUnavailableError(f"lost Redis at {self._url}: {error}") from error
        except redis.ResponseError as error:
            if "SKV" in str(error):
                raise CorruptRecordError(str(error).split("SKV", 1)[1].strip()) from error
            raise

    def _run(self, name: str, args: Sequence[str | bytes | int], keys: Sequence[str] = ()
             ) -> Any:
        with self._request():
            return self._scripts[name](keys=list(keys), args=list(args))

    def store_id(self) -> str:
        return self._cache.store_id(self._fetch_store_id)

    def _fetch_store_id(self) -> str:
        key = f"{self._prefix}:meta"
        with self._request():
            self._client.hsetnx(key, "id", secrets.token_hex(16))
            raw = self._client.hget(key, "id")
        if not isinstance(raw, bytes):
            raise CorruptRecordError("the store's id is missing")
        return raw.decode("ascii", "replace")

    def register_codec(self, identity: CodecIdentity) -> int:
        return self._cache.register(identity, self._add_codec)

    def _add_codec(self, identity: CodecIdentity) -> int:
        keys = [f"{self._prefix}:codecs", f"{self._prefix}:codecidx", f"{self._prefix}:codecn"]
        return int(self._run("register", [identity.digest, identity.description], keys))

    def codec(self, index: int) -> CodecIdentity:
        return self._cache.codec(index, self._fetch_codec)

    def _fetch_codec(self, index: int) -> bytes | None:
        with self._request():
            raw = self._client.hget(f"{self._prefix}:codecs", index)
        return raw if isinstance(raw, bytes) else None

    def lookup(self, ns: NamespaceKey, keys: Sequence[bytes]) -> list[SpanId | None]:
        if not keys:
            return []
        prefix = self._ns(ns)
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(f"{prefix}:i:{key[:2].hex()}", key[2:])
        with self._request():
            values = pipe.execute()
        return [None if value is None else SpanId(int(value)) for value in values]

    def fetch_chain(self, ns: NamespaceKey, span: SpanId) -> tuple[StoredSpan, ...] | None:
        flat = self._run("span", [self._ns(ns), str(span)])
        if flat is None:
            return None
        spans = [StoredSpan(SpanId(int(flat[i])), bytes(flat[i + 1]))
                 for i in range(0, len(flat), 2)]
        return tuple(reversed(spans))

    def fetch_sessions(self, ns: NamespaceKey, names: Sequence[SessionName]
                       ) -> list[SessionChain | None]:
        if not names:
            return []
        entries, flat = self._run("sessions", [self._ns(ns), *names])
        records = {int(flat[i]): bytes(flat[i + 1]) for i in range(0, len(flat), 2)}
        return [None if not entry else _chain_of(_entry(entry), records) for entry in entries]

    def refcounts(self, ns: NamespaceKey, spans: Sequence[SpanId]) -> list[int]:
        if not spans:
            return []
        with self._request():
            values = self._client.hmget(f"{self._ns(ns)}:c", [str(s) for s in spans])
        return [0 if v is None else int(v) for v in values]

    def commit(self, ns: NamespaceKey, plan: CommitPlan) -> SpanId:
        prefix = self._ns(ns)
        args: list[str | bytes | int] = [
            prefix, plan.session, plan.length,
            "" if plan.expect is None else f"{plan.expect.span}:{plan.expect.length}",
            plan.record or b"", "" if plan.parent is None else str(plan.parent),
            plan.dictionary or ""]
        if plan.record is not None:
            for key in plan.index_keys:
                args += [f"{prefix}:i:{key[:2].hex()}", key[2:]]
        status = self._run("commit", args).decode()
        if status == "exists":
            raise SessionExistsError(plan.session)
        if status == "changed":
            raise ConcurrentUpdateError(plan.session)
        if status == "gone":
            raise ParentGoneError(plan.parent)
        if status == "nodict":
            raise DictionaryGoneError(plan.dictionary)
        return SpanId(int(status.removeprefix("ok:")))

    def delete(self, ns: NamespaceKey, name: SessionName) -> bool:
        return bool(self._run("delete", [self._ns(ns), name]))

    def names(self, ns: NamespaceKey) -> list[SessionName]:
        with self._request():
            names = self._client.hkeys(f"{self._ns(ns)}:n")
        return sorted(SessionName(n.decode()) for n in names)

    def _audit(self, ns: NamespaceKey, fix: bool) -> list[int]:
        return [int(v) for v in self._run("audit", [self._ns(ns), "1" if fix else "0"])]

    def audit(self, ns: NamespaceKey) -> AuditReport:
        (sessions, spans, mismatches, missing, orphans, dangling, entries, _, _, dictionaries,
         missing_dictionaries, _) = self._audit(ns, fix=False)
        return AuditReport(sessions, spans, mismatches, missing, orphans, dangling, entries,
                           dictionaries, missing_dictionaries)

    def gc(self, ns: NamespaceKey) -> GcReport:
        _, _, _, _, _, dangling, _, fixed, removed, _, _, dictionaries = self._audit(ns, fix=True)
        return GcReport(0, dangling, fixed, removed, dictionaries)

    def put_dictionary(self, ns: NamespaceKey, digest: str, data: bytes) -> bool:
        prefix = self._ns(ns)
        return bool(self._run("dictionary", [digest, data],
                              [f"{prefix}:d:{digest}", f"{prefix}:dcur"]))

    def current_dictionary(self, ns: NamespaceKey) -> str | None:
        with self._request():
            raw = self._client.get(f"{self._ns(ns)}:dcur")
        return None if raw is None else bytes(raw).decode()

    def fetch_dictionary(self, ns: NamespaceKey, digest: str) -> bytes | None:
        with self._request():
            raw = self._client.get(f"{self._ns(ns)}:d:{digest}")
        return None if raw is None else bytes(raw)

    def dictionary_digests(self, ns: NamespaceKey) -> list[str]:
        prefix = self._ns(ns)
        with self._request():
            keys = list(self._client.scan_iter(match=f"{prefix}:d:*", count=1000))
        return sorted(bytes(key).decode()[len(prefix) + 3 :] for key in keys)

    def byte_counts(self, ns: NamespaceKey) -> ByteCounts:
        records, spans, index, entries, sessions, ids, counts, dictionaries = (
            int(v) for v in self._run("bytes", [self._ns(ns)]))
        prefix = self._ns(ns)
        with self._request():
            keys = list(self._client.scan_iter(match=f"{prefix}:*", count=1000))
            pipe = self._client.pipeline(transaction=False)
            for key in keys:
                pipe.memory_usage(key, samples=0)
            memory = sum(int(v or 0) for v in pipe.execute())
        return ByteCounts(records, spans, index, entries, sessions, ids, counts, memory,
                          dictionaries)

    def close(self) -> None:
        self._client.close()


def _entry(raw: bytes) -> SessionEntry:
    span, length = raw.decode().split(":")
    return SessionEntry(SpanId(int(span)), int(length))


def _chain_of(entry: SessionEntry, records: dict[int, bytes]) -> SessionChain:
    chain = []
    span: SpanId | None = entry.span
    while span is not None:
        record = records[span]
        chain.append(StoredSpan(span, record))
        parent = read_frame(record).parent
        span = None if parent is None else SpanId(parent)
    return SessionChain(entry, tuple(reversed(chain)))
