"""The Redis backend: every change is one Lua script, so it is atomic on the server.

Key layout (``P`` = the key prefix, ``N`` = 32 hex digits of the namespace key)::

    P:meta            hash    store id, schema version (none: 1)
    P:codecs          hash    codec index -> identity description (JSON), stored once
    P:codecidx        hash    codec digest -> codec index
    P:N:id            string  span id counter (INCR: ids only grow)
    P:N:s:<id>        string  span record (``seqkv.formats.span``)
    P:N:c             hash    span id -> reference count
    P:N:n             hash    session id -> "<span>:<length>:<binding, 32 hex digits>" (rows of
                              schema 1, "<span>:<length>", become "<span>:<length>:-")
    P:N:l             hash    session id -> "<span>:<length>": the legacy list, the rows of
                              schema 1 the upgrade marked "-" (``seqkv.store.binding``)
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
4. Every value a script or this module reads is checked before use: the scripts read a record's
   parent only from a record long enough to hold it, walk a chain with a loop and a length guard
   and answer a damaged store with an ``SKV`` error; Python checks every row, id and count again
   (``seqkv.store.backends.base`` invariant 6) and turns every Redis error into a ``SeqKVError``
   (enforced: ``_request``).
5. The schema version is recorded in ``P:meta``; on opening a store of version 1 (none recorded)
   one script marks every row of every namespace unbound (``-``), lists it in its namespace's
   ``P:N:l`` and records the version, unless the store holds a row with a binding or mark, a
   legacy list or a span record of version 2 or later (then it writes nothing and the store is
   refused: ``seqkv.store.binding`` invariant 4); on opening a store of version 2 it lists the
   unbound rows that name a version-1 record (invariant 3 there); a later version is refused by
   name (enforced: ``_open_schema``). Both upgrades delete the index buckets ``P:N:i:<hh>`` in
   the same script (``seqkv.store.backends.base`` invariant 8). The commit and delete scripts
   drop the session's legacy entry with its row, and the session-reading scripts read the entry
   with the row.
   A new span's id is taken (INCR) before its commit, so that the row's binding, a function of
   the span id, is computed here: an id a failed commit took is never used (ids only grow).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import redis

from seqkv.formats.span import READABLE_SPAN_VERSIONS, SpanFrame, read_frame
from seqkv.limits import MAX_CHAIN_SPANS, MAX_POSITIONS, MAX_VARINT_BYTES
from seqkv.store.backends.base import (
    AuditReport,
    ByteCounts,
    CodecIdentity,
    CommitPlan,
    DictionaryGoneError,
    GcReport,
    IdentityCache,
    ParentGoneError,
    Schema1Evidence,
    SessionChain,
    SessionEntry,
    StoredSpan,
    check_schema,
    refuse_schema_1,
    session_entry,
    stored_int,
    walk_chain,
)
from seqkv.store.binding import SCHEMA_1_SPAN_VERSION, STORE_SCHEMA, UNBOUND
from seqkv.store.errors import (
    ConcurrentUpdateError,
    CorruptRecordError,
    SessionExistsError,
    StoreDamagedError,
    StoreUnavailableError,
)
from seqkv.store.ids import NamespaceKey, SessionName, SpanId

# NOTE: a record's parent is read by ``parent_of`` as ``seqkv.formats.span.read_frame`` reads
# it, less the CRC (Python checks it on every record it reads): the length (at least 8 bytes:
# head, three one-byte varints, CRC), a version it reads with its flags, then ``codec``,
# ``parent`` and ``start`` as minimal varints of at most 8 bytes below 2**53 inside the body
# (``seqkv.formats.framing``), ``start`` below 2**31 and zero exactly when ``parent`` is. It
# answers nil, false for a record ``read_frame`` would refuse for any of these. The three sit at
# the same place in every version (``seqkv.formats.span`` invariant 3), within a record's first
# ``HEAD_BYTES`` bytes: ``parent_at`` reads only those and the record's length, for the scripts
# that need the parent alone (the delete cascade, the audit); ``chain`` returns whole records.
# ``tests/test_redis_span_lua.py`` checks both against ``read_frame``.
HEAD_BYTES = 1 + 3 * MAX_VARINT_BYTES
_LIB = """
local span_versions = SPANVERSIONS
local function varint(s, pos, last)
  local v, mul = 0, 1
  for i = 1, MAXVARINTBYTES do
    if pos > last then return nil, pos end
    local b = string.byte(s, pos)
    pos = pos + 1
    v = v + (b % 128) * mul
    if b < 128 then
      if (b == 0 and i > 1) or v >= 2 ^ 53 then return nil, pos end
      return v, pos
    end
    mul = mul * 128
  end
  return nil, pos
end
local function parent_of(head, size)
  if type(head) ~= 'string' or type(size) ~= 'number' or size < 8 then return nil, false end
  local last = math.min(#head, size - 4)
  local version, flags = math.floor(string.byte(head, 1) / 16), string.byte(head, 1) % 16
  if not span_versions[version] or (version == 1 and flags > 1) then return nil, false end
  local codec, pos = varint(head, 2, last)
  if not codec then return nil, false end
  local parent, start
  parent, pos = varint(head, pos, last)
  if not parent then return nil, false end
  start = varint(head, pos, last)
  if not start or start > MAXPOSITIONS or (parent == 0) ~= (start == 0) then
    return nil, false
  end
  if parent == 0 then return nil, true end
  return string.format('%d', parent), true
end
local function parent_at(key)
  local size = redis.pcall('STRLEN', key)
  if type(size) ~= 'number' then return nil, false end
  return parent_of(redis.pcall('GETRANGE', key, 0, HEADBYTES - 1), size)
end
local function release(p, span)
  local ckey = p .. ':c'
  for _ = 1, MAXSPANS do
    if not span then return end
    local n = redis.call('HINCRBY', ckey, span, -1)
    if n > 0 then return end
    local skey = p .. ':s:' .. span
    local parent = parent_at(skey)
    redis.call('DEL', skey)
    redis.call('HDEL', ckey, span)
    redis.call('HDEL', p .. ':sd', span)
    span = parent
  end
end
local function chain(p, span, out, seen, limit)
  local path, steps = {}, 0
  while span do
    if path[span] then return 'its chain loops at span ' .. span end
    if seen[span] then return nil end
    steps = steps + 1
    if steps > limit then return 'its chain holds more spans than its length' end
    local rec = redis.pcall('GET', p .. ':s:' .. span)
    if not rec then return 'it names span ' .. span .. ', which the store lacks' end
    if type(rec) ~= 'string' then return 'span ' .. span .. "'s record is not a string" end
    local parent, ok = parent_of(rec, #rec)
    if not ok then return 'span ' .. span .. "'s record is too short or malformed" end
    path[span] = true
    seen[span] = true
    table.insert(out, span)
    table.insert(out, rec)
    span = parent
  end
  return nil
end
""".replace("MAXSPANS", str(MAX_CHAIN_SPANS)).replace("HEADBYTES", str(HEAD_BYTES)).replace(
    "MAXVARINTBYTES", str(MAX_VARINT_BYTES)).replace(
    "MAXPOSITIONS", str(MAX_POSITIONS)).replace(
    "SPANVERSIONS", "{" + ", ".join(f"[{v}] = true" for v in READABLE_SPAN_VERSIONS) + "}")

_COMMIT = _LIB + """
local p, name, row, expect, record, parent = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local dict, new = ARGV[7], ARGV[8]
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
  span = new
  if redis.call('EXISTS', p .. ':s:' .. span) == 1 then return 'taken' end
  redis.call('SET', p .. ':s:' .. span, record)
  redis.call('HSET', ckey, span, 0)
  if dict ~= '' then redis.call('HSET', p .. ':sd', span, dict) end
  if parent ~= '' then redis.call('HINCRBY', ckey, parent, 1) end
  for i = 9, #ARGV, 2 do
    local old = redis.call('HGET', ARGV[i], ARGV[i + 1])
    if (not old) or redis.call('HEXISTS', ckey, old) == 0 then
      redis.call('HSET', ARGV[i], ARGV[i + 1], span)
    end
  end
end
redis.call('HINCRBY', ckey, span, 1)
redis.call('HSET', nkey, name, span .. ':' .. row)
redis.call('HDEL', p .. ':l', name)
if current then release(p, string.match(current, '^(%d+):')) end
return 'ok:' .. span
"""

_DELETE = _LIB + """
local p, name = ARGV[1], ARGV[2]
local current = redis.call('HGET', p .. ':n', name)
if not current then return 0 end
redis.call('HDEL', p .. ':n', name)
redis.call('HDEL', p .. ':l', name)
release(p, string.match(current, '^(%d+):'))
return 1
"""

_FETCH_SPAN = _LIB + """
local out = {}
if redis.call('EXISTS', ARGV[1] .. ':s:' .. ARGV[2]) == 0 then return false end
local problem = chain(ARGV[1], ARGV[2], out, {}, tonumber(ARGV[3]))
if problem then return redis.error_reply('SKV span ' .. ARGV[2] .. ': ' .. problem) end
return out
"""

_FETCH_SESSIONS = _LIB + """
local p = ARGV[1]
local entries, out, seen, listed = {}, {}, {}, {}
for i = 2, #ARGV do
  local entry = redis.call('HGET', p .. ':n', ARGV[i])
  local legacy = ''
  if entry and string.sub(entry, -2) == ':-' then
    legacy = redis.call('HGET', p .. ':l', ARGV[i]) or ''
  end
  table.insert(listed, legacy)
  if entry then
    local span, length = string.match(entry, '^(%d+):(%d+)')
    if span then
      local problem = chain(p, span, out, seen, math.min(tonumber(length), MAXSPANS))
      if problem then
        return redis.error_reply('SKV session ' .. ARGV[i] .. ': ' .. problem)
      end
    end
    table.insert(entries, entry)
  else
    table.insert(entries, '')
  end
end
return {entries, out, listed}
""".replace("MAXSPANS", str(MAX_CHAIN_SPANS))

# Mark (from the sessions, through parents) and sweep; with ARGV[2] == '1' also repair.
_AUDIT = _LIB + """
local p, fix = ARGV[1], ARGV[2] == '1'
local ckey, nkey = p .. ':c', p .. ':n'
local records, stored, counts, reachable = {}, {}, {}, {}
local malformed, unbound = 0, 0
local cursor = '0'
repeat
  local r = redis.call('SCAN', cursor, 'MATCH', p .. ':s:*', 'COUNT', 1000)
  cursor = r[1]
  for _, key in ipairs(r[2]) do
    local span = string.sub(key, #p + 4)
    local parent, ok = parent_at(key)
    if not ok or not string.match(span, '^%d+$') then malformed = malformed + 1 end
    records[span] = parent or ''
  end
until cursor == '0'
local flat = redis.call('HGETALL', ckey)
for i = 1, #flat, 2 do
  stored[flat[i]] = tonumber(flat[i + 1])
  if not string.match(flat[i + 1], '^%d+$') then malformed = malformed + 1 end
end
for span, parent in pairs(records) do
  if parent ~= '' and not records[parent] then malformed = malformed + 1 end
end
local sessions = redis.call('HGETALL', nkey)
for i = 2, #sessions, 2 do
  local span, length, binding = string.match(sessions[i], '^(%d+):(%d+)(.*)$')
  local legacy = binding == ':-' and
      redis.call('HGET', p .. ':l', sessions[i - 1]) == span .. ':' .. length
  if not span or tonumber(length) < 1 or not (legacy or string.match(binding,
      '^:' .. string.rep('[0-9a-f]', 32) .. '$')) then
    malformed = malformed + 1
  else
    if legacy then unbound = unbound + 1 end
    counts[span] = (counts[span] or 0) + 1
    local path = {}
    while span do
      if not records[span] or path[span] then
        malformed = malformed + 1
        break
      end
      if reachable[span] then break end
      path[span] = true
      reachable[span] = true
      local parent = records[span]
      if parent == '' then span = nil else
        counts[parent] = (counts[parent] or 0) + 1
        span = parent
      end
    end
  end
end
if fix and malformed > 0 then return redis.error_reply('SKVDAMAGED ' .. malformed) end
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
        ndicts, missing_dicts, dicts_removed, malformed, unbound}
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

# Opens the store's schema (KEYS[1] = P:meta, ARGV[1] = STORE_SCHEMA, ARGV[2] = P): a recorded
# version it does not upgrade is returned as {'version', v}. A store of schema 1 (none recorded,
# or '1') is surveyed before anything is written: a row with a third field (a binding or the
# unbound mark), a legacy list or a span record above the schema-1 version returns {'refused',
# marked, listed, newest} and writes nothing; else every row "<span>:<length>" becomes
# "<span>:<length>:-" and is listed in its namespace's P:N:l. A store of schema 2 lists its
# unbound rows whose span's record is of the schema-1 version. Both delete the index buckets,
# keyed by the old hash (base invariant 8), and record the version.
_SCHEMA = """
local version = redis.call('HGET', KEYS[1], 'schema')
if version and version ~= '1' and version ~= '2' then return {'version', version} end
local p = ARGV[2]
local function keys(pattern, kind)
  local found, cursor = {}, '0'
  repeat
    local r = redis.call('SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000)
    cursor = r[1]
    for _, key in ipairs(r[2]) do
      if redis.call('TYPE', key)['ok'] == kind then table.insert(found, key) end
    end
  until cursor == '0'
  return found
end
local function record_version(key)
  local head = redis.pcall('GETRANGE', key, 0, 0)
  if type(head) ~= 'string' or #head ~= 1 then return 0 end
  return math.floor(string.byte(head) / 16)
end
local tables = keys(p .. ':*:n', 'hash')
local listed = 0
if version == '2' then
  for _, key in ipairs(tables) do
    local ns = string.sub(key, 1, #key - 2)
    local rows = redis.call('HGETALL', key)
    for i = 1, #rows, 2 do
      local span, length = string.match(rows[i + 1], '^(%d+):(%d+):%-$')
      if span and record_version(ns .. ':s:' .. span) == SCHEMA1SPAN then
        redis.call('HSET', ns .. ':l', rows[i], span .. ':' .. length)
        listed = listed + 1
      end
    end
  end
else
  local marked, lists, newest, old = 0, 0, 0, {}
  for _, key in ipairs(tables) do
    local rows = redis.call('HGETALL', key)
    for i = 1, #rows, 2 do
      if string.match(rows[i + 1], '^%d+:%d+$') then
        table.insert(old, {key, rows[i], rows[i + 1]})
      elseif string.match(rows[i + 1], '^[^:]*:[^:]*:') then
        marked = marked + 1
      end
    end
  end
  for _, key in ipairs(keys(p .. ':*:l', 'hash')) do lists = lists + redis.call('HLEN', key) end
  for _, key in ipairs(keys(p .. ':*:s:*', 'string')) do
    newest = math.max(newest, record_version(key))
  end
  if marked > 0 or lists > 0 or newest > SCHEMA1SPAN then
    return {'refused', marked, lists, newest}
  end
  for _, row in ipairs(old) do
    redis.call('HSET', row[1], row[2], row[3] .. ':-')
    redis.call('HSET', string.sub(row[1], 1, #row[1] - 2) .. ':l', row[2], row[3])
    listed = listed + 1
  end
end
for _, key in ipairs(keys(p .. ':*:i:*', 'hash')) do
  if string.match(string.sub(key, #p + 1), '^:%x+:i:%x+$') then redis.call('DEL', key) end
end
redis.call('HSET', KEYS[1], 'schema', ARGV[1])
return {'upgraded', listed}
""".replace("SCHEMA1SPAN", str(SCHEMA_1_SPAN_VERSION))

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
        try:
            self._client: Any = redis.Redis.from_url(url, socket_connect_timeout=5,
                                                     socket_timeout=120)
        except ValueError as error:
            raise StoreUnavailableError(f"{url!r} is not a Redis URL: {error}; write "
                                        "redis://HOST:PORT/DB") from None
        self._url = url
        self._prefix = prefix
        self._trips = 0
        try:
            self._client.ping()
        except (redis.RedisError, ValueError) as error:
            raise StoreUnavailableError(f"cannot reach Redis at {url}: {error}") from error
        self._scripts = {
            name: self._client.register_script(source)
            for name, source in (("commit", _COMMIT), ("delete", _DELETE),
                                 ("span", _FETCH_SPAN), ("sessions", _FETCH_SESSIONS),
                                 ("audit", _AUDIT), ("bytes", _BYTES), ("register", _REGISTER),
                                 ("dictionary", _PUT_DICTIONARY), ("schema", _SCHEMA))
        }
        self._cache = IdentityCache()
        self._open_schema()

    def _open_schema(self) -> None:
        """Check the schema version; record it, upgrading a store of version 1 or 2 (invariant
        5)."""
        where = f"{self._url} (prefix {self._prefix!r})"
        reply = self._run("schema", [str(STORE_SCHEMA), self._prefix], [f"{self._prefix}:meta"])
        status = reply[0] if isinstance(reply, list) and reply else None
        if status == b"version" and len(reply) == 2:
            check_schema(reply[1], where)
        elif status == b"refused" and len(reply) == 4:
            refuse_schema_1(Schema1Evidence(*(stored_int(v, "a schema survey's count")
                                              for v in reply[1:])), where)
        elif status != b"upgraded":
            raise CorruptRecordError(f"Redis at {where} answered the schema check with "
                                     f"{reply!r:.80}: not a Redis that runs the store's scripts")

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
            text = str(error)
            if "SKVDAMAGED" in text:
                raise StoreDamagedError(
                    f"the store at {self._url} holds {text.split('SKVDAMAGED', 1)[1].strip()} "
                    "malformed rows or records in this namespace: gc would delete what a "
                    "session may need; run seqkv store audit --deep to name the damaged "
                    "sessions, repair or delete them, then gc") from error
            if "SKV" in text:
                raise CorruptRecordError(text.split("SKV", 1)[1].strip()) from error
            raise CorruptRecordError(f"Redis at {self._url} refused a request on the store's "
                                     f"keys (damaged or of the wrong type): {text}") from error
        except redis.RedisError as error:
            raise StoreUnavailableError(f"Redis at {self._url}: {error}") from error

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
        return stored_int(self._run("register", [identity.digest, identity.description], keys),
                          "a codec's index", 1)

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
        # a malformed entry is no candidate (``gc`` drops it)
        return [None if not isinstance(value, bytes) or not value.isdigit()
                or not 0 < len(value) < 19 else SpanId(int(value)) for value in values]

    def fetch_chain(self, ns: NamespaceKey, span: SpanId) -> tuple[StoredSpan, ...] | None:
        flat = self._run("span", [self._ns(ns), str(span), MAX_CHAIN_SPANS])
        if flat is None:
            return None
        return _chain_of(f"span {span}", span, MAX_CHAIN_SPANS, _records(flat), {})

    def fetch_sessions(self, ns: NamespaceKey, names: Sequence[SessionName]
                       ) -> list[SessionChain | None]:
        if not names:
            return []
        entries, flat, listed = self._run("sessions", [self._ns(ns), *names])
        records = _records(flat)
        frames: dict[SpanId, SpanFrame] = {}
        out: list[SessionChain | None] = []
        for name, raw, legacy in zip(names, entries, listed, strict=True):
            if not raw:
                out.append(None)
                continue
            entry = _entry(name, raw, legacy)
            out.append(SessionChain(entry, _chain_of(f"session {name!r}", entry.span,
                                                     entry.length, records, frames)))
        return out

    def refcounts(self, ns: NamespaceKey, spans: Sequence[SpanId]) -> list[int]:
        if not spans:
            return []
        with self._request():
            values = self._client.hmget(f"{self._ns(ns)}:c", [str(s) for s in spans])
        return [0 if v is None else stored_int(v, f"span {s}'s reference count")
                for s, v in zip(spans, values, strict=True)]

    def commit(self, ns: NamespaceKey, plan: CommitPlan) -> SpanId:
        prefix = self._ns(ns)
        span = plan.parent
        if plan.record is not None:
            with self._request():
                span = SpanId(stored_int(self._client.incr(f"{prefix}:id"), "the span counter"))
        assert span is not None
        binding = ":-" if plan.binding is None else ":" + plan.binding(span).hex()
        args: list[str | bytes | int] = [
            prefix, plan.session, f"{plan.length}{binding}",
            "" if plan.expect is None else _row(plan.expect),
            plan.record or b"", "" if plan.parent is None else str(plan.parent),
            plan.dictionary or "", str(span) if plan.record is not None else ""]
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
        if status == "taken":
            raise CorruptRecordError(f"span {span} exists before its commit: the store's span "
                                     "counter was damaged")
        return SpanId(stored_int(status.removeprefix("ok:"), "a committed span"))

    def delete(self, ns: NamespaceKey, name: SessionName) -> bool:
        return bool(self._run("delete", [self._ns(ns), name]))

    def names(self, ns: NamespaceKey) -> list[SessionName]:
        with self._request():
            names = self._client.hkeys(f"{self._ns(ns)}:n")
        return sorted(SessionName(n.decode("utf-8", "backslashreplace")) for n in names)

    def _audit(self, ns: NamespaceKey, fix: bool) -> list[int]:
        return [int(v) for v in self._run("audit", [self._ns(ns), "1" if fix else "0"])]

    def audit(self, ns: NamespaceKey) -> AuditReport:
        (sessions, spans, mismatches, missing, orphans, dangling, entries, _, _, dictionaries,
         missing_dictionaries, _, malformed, unbound) = self._audit(ns, fix=False)
        return AuditReport(sessions, spans, mismatches, missing, orphans, dangling, entries,
                           dictionaries, missing_dictionaries, malformed, unbound)

    def gc(self, ns: NamespaceKey) -> GcReport:
        (_, _, _, _, _, dangling, _, fixed, removed, _, _, dictionaries, _,
         _) = self._audit(ns, fix=True)
        return GcReport(0, dangling, fixed, removed, dictionaries)

    def put_dictionary(self, ns: NamespaceKey, digest: str, data: bytes) -> bool:
        prefix = self._ns(ns)
        return bool(self._run("dictionary", [digest, data],
                              [f"{prefix}:d:{digest}", f"{prefix}:dcur"]))

    def current_dictionary(self, ns: NamespaceKey) -> str | None:
        with self._request():
            raw = self._client.get(f"{self._ns(ns)}:dcur")
        if raw is None:
            return None
        if not _DIGEST.fullmatch(bytes(raw)):
            raise CorruptRecordError(f"the namespace's current dictionary is named "
                                     f"{bytes(raw)[:80]!r}, not a digest: the store's metadata "
                                     "was damaged")
        return bytes(raw).decode("ascii")

    def fetch_dictionary(self, ns: NamespaceKey, digest: str) -> bytes | None:
        with self._request():
            raw = self._client.get(f"{self._ns(ns)}:d:{digest}")
        return None if raw is None else bytes(raw)

    def dictionary_digests(self, ns: NamespaceKey) -> list[str]:
        prefix = self._ns(ns)
        with self._request():
            keys = list(self._client.scan_iter(match=f"{prefix}:d:*", count=1000))
        names = (bytes(key)[len(prefix) + 3 :] for key in keys)
        return sorted(name.decode("ascii") for name in names if _DIGEST.fullmatch(name))

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


_DIGEST = re.compile(rb"[0-9a-f]{64}")
_ROW = re.compile(rb"(\d{1,19}):(-?\d{1,19})(?::([0-9a-f]{32}|-))?")
_LISTED = re.compile(rb"(\d{1,19}):(\d{1,19})")


def _row(entry: SessionEntry) -> str:
    """A session row as the scripts store it (what ``_entry`` reads)."""
    binding = "-" if entry.binding is None else entry.binding.hex()
    return f"{entry.span}:{entry.length}:{binding}"


def _entry(name: SessionName, raw: object, legacy: object = b"") -> SessionEntry:
    """A session row read from Redis with its legacy list entry (``b""``: none), checked
    (``seqkv.store.backends.base`` invariants 6 and 7)."""
    match = _ROW.fullmatch(raw) if isinstance(raw, bytes) else None
    if match is None:
        shown = raw[:60] if isinstance(raw, bytes) else raw
        raise CorruptRecordError(f"session {name!r}'s row {shown!r} is not "
                                 "<span>:<length>:<binding>: the store's metadata was damaged")
    binding = (None if match[3] is None else UNBOUND if match[3] == b"-"
               else bytes.fromhex(match[3].decode("ascii")))
    listed = _LISTED.fullmatch(legacy) if isinstance(legacy, bytes) else None
    return session_entry(name, match[1], match[2], binding,
                         None if listed is None else (listed[1], listed[2]))


def _records(flat: Sequence[object]) -> dict[SpanId, bytes]:
    """The (span, record) pairs a script returned, checked."""
    records: dict[SpanId, bytes] = {}
    for i in range(0, len(flat) - 1, 2):
        record = flat[i + 1]
        if not isinstance(record, bytes):
            raise CorruptRecordError("a script returned a record that is not bytes")
        records[SpanId(stored_int(flat[i], "a span id", 1))] = record
    return records


def _chain_of(label: str, span: SpanId, limit: int, records: Mapping[SpanId, bytes],
              frames: dict[SpanId, SpanFrame]) -> tuple[StoredSpan, ...]:
    """The chain through ``span``, root first, walked with a loop and a length guard;
    ``frames``: the records' frames read so far in this request (each record is read once)."""

    def parent_of(walk: SpanId) -> SpanId | None:
        if walk not in records:
            raise CorruptRecordError(f"{label}: the chain names span {walk}, which the store "
                                     "lacks: the store's metadata was damaged")
        frame = frames.get(walk)
        if frame is None:
            frames[walk] = frame = read_frame(records[walk])
        return None if frame.parent is None else SpanId(frame.parent)

    return tuple(StoredSpan(s, records[s], frames[s])
                 for s in walk_chain(label, span, limit, parent_of))
