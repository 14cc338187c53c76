"""Applied-event marks in Redis: one round trip to ask, one to mark, the loop on the server.

A mark means "this event took effect on the world's branch". Marks are written only after the
Nessie commit, so a missing mark never hides an unapplied event; the branch's recorded offsets
cover the window between commit and mark.

Bounded: marks live for the dedupe window (``dedupe_window_s``), packed into per-world buckets
(``agents.dedupe_window``: 16 bytes per UUID or CDC id, the id's bytes plus a few for any other);
a duplicate older than the window is caught by the branch's event log at commit time
(docs/architecture.md, "Dedupe state"). Memory = rate × (window + window/2) × bytes per mark.

Cost: a server-side script (``EVALSHA``) loops over a batch's ids, so redis-py packs one command
per world instead of one command per event (measured ~14 µs per key pipelined against ~0.6 µs per
key in a script, docs/benchmarks.md), and a bucket's ids travel as one argument (``_blob``): redis-py
spends ~1 µs packing each argument. The scripts touch only the keys they are given.

Redis Cluster: the world is every key's hash tag, so one world's keys share a slot and each script
call (one per world) stays in one slot. Marks of the earlier formats, one key per event with a
7-day TTL, are still read until they expire: ``causeway:applied:{<world>}:<event_id>`` while
``read_per_event`` is on, and the one before the hash tag (``causeway:applied:<world>:<event_id>``)
while ``read_legacy`` is on; the latter span slots, so turn it off on a cluster. The lookup script
builds those keys itself from their prefix and the batch's ids (one argument per world), for the
ids no slot holds: they are not declared as keys. The hash-tagged one is in the world's slot, the
slot of the call's declared keys, so a cluster serves it; the legacy one never was (see above).

``DeadLetterMarks`` keeps the other durable decision the same way: which origins were dead-lettered
(``causeway:dead:...``, see ``agents.letter_marks``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import NoScriptError

from agents.dedupe import KEY_PREFIX as OLD_KEY_PREFIX
from agents.dedupe import applied_key as mark_key
from agents.dedupe import legacy_applied_key
from agents.dedupe_window import FAMILIES, PACKED, MarkWindow
from agents.letter_marks import CONFIRMED, WorldLookup, by_tag

if TYPE_CHECKING:
    from streams.settings import Settings

log = logging.getLogger(__name__)

#: Keys per script call: keeps one call to a few milliseconds of server time.
CHUNK = 5_000

MARK_LUA = """
local ttl = ARGV[1]
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], '1', 'EX', ttl)
end
return #KEYS
"""

# KEYS: n current-format keys, then (optionally) the same n refs in the legacy format.
# Returns the 1-based positions (among the first n) that are marked in either format.
LOOKUP_LUA = """
local n = tonumber(ARGV[1])
local legacy = #KEYS > n
local hits = {}
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 or (legacy and redis.call('EXISTS', KEYS[n + i]) == 1) then
    hits[#hits + 1] = i
  end
end
return hits
"""


# Is a 16-byte record in a string of concatenated records (aligned: a match across two records is not one)?
_FOUND_LUA = """
local function find_rec(blob, rec)
  local pos = 1
  while true do
    local s = string.find(blob, rec, pos, true)
    if not s then return nil end
    if (s - 1) % PACKED == 0 then return s end
    pos = s + 1
  end
end
local function found(blob, rec)
  return find_rec(blob, rec) ~= nil
end
""".replace("PACKED", str(PACKED))

# A batch's ids of one bucket travel as one argument (a blob), not one argument each: redis-py
# spends ~1 µs packing each argument, which was most of the client's CPU per lookup. Packed ids are
# concatenated 16-byte records; any other id is UTF-8 text, NUL-separated (an event id never holds
# a NUL: ``models.events`` rejects it, and ``_blob`` checks).
_RECORDS_LUA = """
local function records(blob, kind)
  local out = {}
  if kind == 'p' then
    for s = 1, #blob, PACKED do out[#out + 1] = string.sub(blob, s, s + PACKED - 1) end
    return out
  end
  local pos = 1
  while true do
    local z = string.find(blob, '\\0', pos, true)
    if not z then
      out[#out + 1] = string.sub(blob, pos)
      return out
    end
    out[#out + 1] = string.sub(blob, pos, z - 1)
    pos = z + 1
  end
end
""".replace("PACKED", str(PACKED))

# KEYS: bucket keys of the current slot. ARGV: expire-at, then per key: kind ('p' packed string,
# 'h' hash) and its ids' blob. Returns how many ids were given.
WINDOW_MARK_LUA = (
    _FOUND_LUA
    + _RECORDS_LUA
    + """
local at = ARGV[1]
local given = 0
for i = 1, #KEYS do
  local kind = ARGV[2 * i]
  local recs = records(ARGV[2 * i + 1], kind)
  if kind == 'p' then
    local blob = redis.call('GET', KEYS[i]) or ''
    local add = {}
    for _, rec in ipairs(recs) do
      if not found(blob, rec) then add[#add + 1] = rec end
    end
    if #add > 0 then redis.call('SET', KEYS[i], blob .. table.concat(add)) end
  else
    -- One HSET a bucket (and span of ids), not one an id.
    for s = 1, #recs, 1000 do
      local fields = {}
      for q = s, math.min(s + 999, #recs) do
        fields[#fields + 1] = recs[q]
        fields[#fields + 1] = ''
      end
      redis.call('HSET', KEYS[i], unpack(fields))
    end
  end
  redis.call('EXPIREAT', KEYS[i], at)
  given = given + #recs
end
return given
"""
)

# KEYS: G groups of m keys (one bucket in each live slot). ARGV: m, e, G, then per group its kind
# ('p' packed / 'h' hash) and its ids' blob; then, when e > 0, the e per-event key prefixes of the old
# formats and every id as text, NUL-separated, in group order (one argument, not a key per id and
# format: see ``AppliedMarks.applied``). Returns the 1-based positions (in group order) of the ids
# found in any slot or old key. An old key is only asked for an id no slot holds.
WINDOW_LOOKUP_LUA = (
    _FOUND_LUA
    + _RECORDS_LUA
    + """
local m, e, G = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local old, texts = {}, nil
if e > 0 then
  for x = 1, e do old[x] = ARGV[3 + 2 * G + x] end
  texts = records(ARGV[4 + 2 * G + e], 'h')
end
local hits, pending = {}, {}
local i = 0
for g = 1, G do
  local kind = ARGV[2 + 2 * g]
  local first = (g - 1) * m
  local blobs = {}
  if kind == 'p' then
    for j = 1, m do blobs[j] = redis.call('GET', KEYS[first + j]) or '' end
  end
  local recs = records(ARGV[3 + 2 * g], kind)
  local hit = {}
  if kind == 'p' then
    for k, data in ipairs(recs) do
      for j = 1, m do
        if found(blobs[j], data) then hit[k] = true break end
      end
    end
  else
    -- One HMGET a slot's bucket for all its ids, not one HEXISTS an id and slot: each redis.call
    -- costs the server ~1.5 µs beyond the command itself.
    for j = 1, m do
      for s = 1, #recs, SPAN do
        local vals = redis.call('HMGET', KEYS[first + j], unpack(recs, s, math.min(s + SPAN - 1, #recs)))
        for k = 1, #vals do
          if vals[k] then hit[s + k - 1] = true end
        end
      end
    end
  end
  for k = 1, #recs do
    if hit[k] then hits[#hits + 1] = i + k elseif e > 0 then pending[#pending + 1] = i + k end
  end
  i = i + #recs
end
-- The old formats, for the ids no slot holds: one MGET a format and span of ids.
for x = 1, e do
  local rest = {}
  for s = 1, #pending, SPAN do
    local keys = {}
    for q = s, math.min(s + SPAN - 1, #pending) do keys[#keys + 1] = old[x] .. texts[pending[q]] end
    local vals = redis.call('MGET', unpack(keys))
    for k = 1, #vals do
      if vals[k] then hits[#hits + 1] = pending[s + k - 1] else rest[#rest + 1] = pending[s + k - 1] end
    end
  end
  pending = rest
end
table.sort(hits)
return hits
"""
).replace("SPAN", "1000")

# KEYS: bucket keys; ARGV: per key kind, count, records or fields. Removes them; returns how many were there.
WINDOW_FORGET_LUA = (
    _FOUND_LUA
    + """
local pos = 1
local removed = 0
for i = 1, #KEYS do
  local kind, n = ARGV[pos], tonumber(ARGV[pos + 1])
  pos = pos + 2
  if kind == 'p' then
    local blob = redis.call('GET', KEYS[i])
    if blob then
      for j = 0, n - 1 do
        local s = find_rec(blob, ARGV[pos + j])
        if s then
          blob = string.sub(blob, 1, s - 1) .. string.sub(blob, s + PACKED)
          removed = removed + 1
        end
      end
      redis.call('SET', KEYS[i], blob, 'KEEPTTL')
    end
  else
    for j = 0, n - 1 do removed = removed + redis.call('HDEL', KEYS[i], ARGV[pos + j]) end
  end
  pos = pos + n
end
return removed
""".replace("PACKED", str(PACKED))
)

# Dead-letter decisions carry a value (pending with its time, or confirmed): get and set it.
STATES_LUA = """
local out = {}
for i = 1, #KEYS do
  local v = redis.call('GET', KEYS[i])
  if v then
    out[#out + 1] = i
    out[#out + 1] = v
  end
end
return out
"""

# The decisions of one world's decoded records, keys built here from their parts (``WorldLookup``:
# one argument each for the ids, the origins and the redrive counts, not two keys a record).
# KEYS[1]: the world's origin-key prefix (in the world's slot, as every key built here). ARGV: the
# event-key prefix, the ids, the origins ("<topic>:<partition>:<offset>") and the redrive counts
# ('' when all are 0), each NUL-separated. Returns (position, 'o' or 'e', value) for each key set.
ARRIVAL_STATES_LUA = (
    _RECORDS_LUA
    + """
local ids = records(ARGV[2], 'h')
local origins = records(ARGV[3], 'h')
local redrives = nil
if ARGV[4] ~= '' then redrives = records(ARGV[4], 'h') end
local out = {}
-- One MGET a kind and span of records, not one GET a key: each redis.call costs the server
-- ~1.5 µs beyond the command itself.
for s = 1, #ids, 1000 do
  local last = math.min(s + 999, #ids)
  local okeys, ekeys = {}, {}
  for i = s, last do
    okeys[#okeys + 1] = KEYS[1] .. origins[i] .. ':' .. ids[i]
    ekeys[#ekeys + 1] = ARGV[1] .. (redrives and redrives[i] or '0') .. ':' .. ids[i]
  end
  local ovals = redis.call('MGET', unpack(okeys))
  local evals = redis.call('MGET', unpack(ekeys))
  for k = 1, last - s + 1 do
    if ovals[k] then
      out[#out + 1] = s + k - 1
      out[#out + 1] = 'o'
      out[#out + 1] = ovals[k]
    end
    if evals[k] then
      out[#out + 1] = s + k - 1
      out[#out + 1] = 'e'
      out[#out + 1] = evals[k]
    end
  end
end
return out
"""
)

RECORD_LUA = """
for i = 1, #KEYS do
  redis.call('SET', KEYS[i], ARGV[2], 'EX', ARGV[1])
end
return #KEYS
"""

# Deletes each key still holding the value it was read with (a decision confirmed since stays).
FORGET_LUA = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    redis.call('DEL', KEYS[i])
    n = n + 1
  end
end
return n
"""


def _blob(kind: str, datas: list[bytes]) -> bytes:
    """One bucket's stored ids as one script argument: 16-byte records back to back (kind ``p``,
    packed), or NUL-separated (kind ``h``, hash fields; an event id never holds a NUL)."""
    if kind == "p":
        return b"".join(datas)
    blob = b"\0".join(datas)
    if blob.count(b"\0") != len(datas) - 1:
        raise ValueError("an event id holds a NUL character; the event contract rejects those")
    return blob


def _text_blob(ids: list[str]) -> bytes:
    """Ids as text, NUL-separated, in one argument (joined once, encoded once)."""
    blob = "\0".join(ids).encode()
    if blob.count(b"\0") != len(ids) - 1:
        raise ValueError("an event id holds a NUL character; the event contract rejects those")
    return blob


class _PackOnce(AbstractConnection):
    """Connection mixin: a command whose arguments are all str, bytes or int is packed in one pass.

    redis-py's generic packer spends ~1 µs per argument (type checks, a join per argument), and a
    batch's script call has thousands of them (its bucket keys, the old formats' per-event keys, the
    dead-letter decisions' keys). The bytes sent are the same (``tests/unit/test_agents_marks.py``);
    anything else (a float, a command name with a space) goes to redis-py's own packer.
    """

    def pack_command(self, *args: Any) -> list[bytes]:
        if not args or type(args[0]) is not str or " " in args[0]:
            return super().pack_command(*args)
        encoding, errors = self.encoder.encoding, self.encoder.encoding_errors
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            kind = type(arg)
            if kind is str:
                arg = arg.encode(encoding, errors)
            elif kind is int:
                arg = b"%d" % arg
            elif kind is not bytes:
                return super().pack_command(*args)
            parts.append(b"$%d\r\n%b\r\n" % (len(arg), arg))
        return [b"".join(parts)]


_PACKING_ONCE: dict[type[AbstractConnection], type[AbstractConnection]] = {}


def _packing_once(base: type[AbstractConnection]) -> type[AbstractConnection]:
    if issubclass(base, _PackOnce):
        return base
    if base not in _PACKING_ONCE:
        _PACKING_ONCE[base] = type(f"PackOnce{base.__name__}", (_PackOnce, base), {})
    return _PACKING_ONCE[base]


def pack_once(client: aioredis.Redis) -> aioredis.Redis:
    """Make ``client``'s new connections pack commands with :class:`_PackOnce` (plain, TLS or unix
    socket alike: the pool's own connection class is kept underneath). Returns ``client``."""
    pool = client.connection_pool
    pool.connection_class = _packing_once(pool.connection_class)
    return client


@functools.lru_cache(maxsize=64)
def _sha(script: str) -> str:
    # Once per script text, not per call: hashing the lookup script (~3 KB) each call was 0.6 % of
    # a draining worker's samples (py-spy, docs/benchmarks.md, "2026-12-03 late morning").
    return hashlib.sha1(script.encode()).hexdigest()  # noqa: S324 - Redis names scripts by SHA-1


def by_world(pairs: Iterable[tuple[str, str]], chunk: int = CHUNK) -> list[tuple[str, list[str]]]:
    """Unique (world, event_id) pairs grouped by world, in chunks of at most ``chunk`` ids."""
    grouped: dict[str, dict[str, None]] = defaultdict(dict)
    for world, event_id in pairs:
        grouped[world][event_id] = None
    out: list[tuple[str, list[str]]] = []
    for world, ids in grouped.items():
        listed = list(ids)
        out += [(world, listed[i : i + chunk]) for i in range(0, len(listed), chunk)]
    return out


#: Scripts each client has loaded: a client loads a script before its first call, not after the
#: call fails with NOSCRIPT. redis-py formats a failed pipeline command's every argument into the
#: error message (``annotate_exception``), and a batch's call has thousands: ~0.5 s of CPU once
#: per script and worker, measured in the worker's profile (docs/benchmarks.md, 2026-12-02 early morning).
_LOADED: weakref.WeakKeyDictionary[aioredis.Redis, set[str]] = weakref.WeakKeyDictionary()


async def run_scripts(client: aioredis.Redis, script: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
    """Run ``script`` once per (keys, args) in one pipelined round trip; loads it first on a client's
    first call, and again if Redis lost it (a restart, ``SCRIPT FLUSH``)."""
    return await run_script_sets(client, [(script, calls)])


async def run_script_sets(
    client: aioredis.Redis, sets: Sequence[tuple[str, Sequence[tuple[list[str], list[Any]]]]]
) -> list[Any]:
    """``run_scripts`` for several scripts' calls in one round trip (pipelined when more than one);
    the answers in order."""
    loaded = _LOADED.setdefault(client, set())
    shas = []
    for script, _ in sets:
        sha = _sha(script)
        if sha not in loaded:
            await client.script_load(script)
            loaded.add(sha)
        shas.append(sha)
    calls = [(sha, keys, args) for sha, (_, set_calls) in zip(shas, sets, strict=True) for keys, args in set_calls]
    for attempt in (1, 2):
        try:
            if len(calls) == 1:
                # One call (a world's marks after its commit: one a flush at 100 worlds) needs no
                # pipeline: redis-py's pipeline of one cost ~470 µs of CPU against ~300 µs sent
                # alone (docs/benchmarks.md, 2026-12-02 afternoon, "many worlds").
                [(sha, keys, args)] = calls
                return [await client.evalsha(sha, len(keys), *keys, *args)]
            async with client.pipeline(transaction=False) as pipe:
                for sha, keys, args in calls:
                    pipe.evalsha(sha, len(keys), *keys, *args)
                return list(await pipe.execute())
        except NoScriptError:
            if attempt == 2:
                raise
            for script, _ in sets:
                await client.script_load(script)
    raise AssertionError("unreachable")


#: Seconds between scans for marks of the old per-event formats (``AppliedMarks._check_old_formats``).
OLD_FORMATS_RECHECK_S = 3600.0
#: Set, with the recheck period as its TTL, by a worker whose scan found no old-format mark: the
#: other workers, and this one after a restart, take its word instead of scanning again.
OLD_FORMATS_ABSENT_KEY = "causeway:marks:old-formats-absent"
#: Keys a ``SCAN`` call walks, and the pause between calls: a scan of a million keys takes Redis
#: ~1 s of CPU, spread over ~10 s instead of held in one burst at a worker's start.
SCAN_COUNT, SCAN_PAUSE_S = 1_000, 0.01


async def old_format_marks_exist(client: aioredis.Redis, count: int = SCAN_COUNT, pause_s: float = 0.0) -> bool:
    """Does Redis hold any key of the per-event mark formats (``causeway:applied:...``)? A ``SCAN``
    through the keyspace that stops at the first one, pausing ``pause_s`` between calls."""
    cursor = 0
    while True:
        cursor, keys = await client.scan(cursor, match=f"{OLD_KEY_PREFIX}*", count=count)
        if keys:
            return True
        if int(cursor) == 0:
            return False
        if pause_s:
            await asyncio.sleep(pause_s)


class AppliedMarks:
    """Applied-event marks for the dedupe window (see the module doc and ``agents.dedupe_window``).

    ``clock``: wall-clock seconds (``time.time``); every worker's marks land in the slot of their
    clock, so clocks should agree to well within a slot (window / 2).
    """

    def __init__(
        self,
        client: aioredis.Redis,
        window_s: int,
        *,
        buckets: int = 1024,
        read_per_event: bool = True,
        read_legacy: bool = True,
        clock: Callable[[], float] = time.time,
        prefix: str | None = None,
        old_formats_recheck_s: float = OLD_FORMATS_RECHECK_S,
    ) -> None:
        self._redis = client
        self.window = MarkWindow(window_s, buckets) if prefix is None else MarkWindow(window_s, buckets, prefix)
        self._bucket_names = self.window.bucket_names()
        self.read_per_event = read_per_event
        self.read_legacy = read_legacy
        self.clock = clock
        #: Whether a key of the old per-event formats may exist: assumed until a scan finds none.
        self.old_formats_seen = True
        self.old_formats_recheck_s = old_formats_recheck_s
        self._old_checked_at: float | None = None
        self._old_scan: asyncio.Task[None] | None = None

    @classmethod
    def from_url(cls, url: str, window_s: int, *, buckets: int = 1024, **options: Any) -> AppliedMarks:
        """``options``: the constructor's keywords, then streams.security.redis_options (password, ACL user, TLS CA)."""
        own = {
            k: options.pop(k)
            for k in ("read_per_event", "read_legacy", "clock", "prefix", "old_formats_recheck_s")
            if k in options
        }
        client = aioredis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, **options)
        return cls(pack_once(client), window_s, buckets=buckets, **own)

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> AppliedMarks:
        """The marks every component shares: one window and bucket count, so all read the same keys."""
        return cls.from_url(
            settings.redis_url,
            settings.dedupe_window_s,
            buckets=settings.dedupe_mark_buckets,
            read_per_event=settings.dedupe_read_per_event_marks,
            read_legacy=settings.dedupe_read_legacy_marks,
            old_formats_recheck_s=settings.dedupe_old_marks_recheck_s,
            **options,
        )

    def _grouped(self, world: str, ids: list[str], slot: int) -> dict[str, tuple[str, list[bytes]]]:
        """The ids by bucket key of ``slot``: key → (kind, stored bytes)."""
        # By (family, bucket) first, then one key string per bucket: a key built per id cost
        # about a fifth of the marks' client CPU (a batch's ids spread over at most ``buckets``).
        prefixes = {family: self.window.key_prefix(world, slot, family) for family in FAMILIES}
        return {
            prefixes[family] + self._bucket_names[bucket]: ("h" if family == "s" else "p", datas)
            for (family, bucket), (_, datas) in self.window.groups(ids)
        }

    @staticmethod
    def _per_key_args(grouped: dict[str, tuple[str, list[bytes]]]) -> list[Any]:
        args: list[Any] = []
        for kind, data in grouped.values():
            args += [kind, len(data), *data]
        return args

    async def applied(self, pairs: Iterable[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which (world, event_id) pairs are marked within the window (or in an old format); one round trip."""
        groups = by_world(pairs)
        if not groups:
            return set()
        now = self.clock()
        slots = self.window.live_slots(now)
        self._check_old_formats(now)
        old = self.old_formats_seen
        read_per_event, read_legacy = self.read_per_event and old, self.read_legacy and old
        per_event = int(read_per_event) + int(read_legacy)
        key_prefix, names = self.window.key_prefix, self._bucket_names
        calls = []
        orders: list[list[str]] = []
        for world, ids in groups:
            buckets = self.window.groups(ids)
            keys: list[str] = []
            args: list[Any] = [len(slots), per_event, len(buckets)]
            order: list[str] = []
            prefixes = {family: [key_prefix(world, slot, family) for slot in slots] for family in FAMILIES}
            for (family, bucket), (event_ids, datas) in buckets:
                tail = names[bucket]
                keys += [prefix + tail for prefix in prefixes[family]]
                kind = "h" if family == "s" else "p"
                args += [kind, _blob(kind, datas)]
                order += event_ids
            if per_event:
                # The old formats' keys are built by the script from their prefix and the ids' text:
                # sent as keys, two a id, they were most of the lookup's arguments (each one formatted
                # here, packed and parsed), read only for ids no slot holds.
                if read_per_event:
                    args.append(mark_key(world, ""))
                if read_legacy:
                    args.append(legacy_applied_key(world, ""))
                args.append(_text_blob(order))
            calls.append((keys, args))
            orders.append(order)
        answers = await self._scripts(WINDOW_LOOKUP_LUA, calls)
        return {
            (world, order[pos - 1])
            for (world, _), order, hits in zip(groups, orders, answers, strict=True)
            for pos in hits
        }

    def _check_old_formats(self, now: float) -> None:
        """Start a scan for keys of the old per-event formats when one is due (in the background).

        Reading them cost the lookup two ``MGET`` keys an id (~28 of 45 ms of Redis time for 10,000
        fresh ids, docs/benchmarks.md, "2026-12-03 late morning"), for marks that expire 7 days after
        an upgrade and are never written again. Once a scan finds none, they are not read until a
        later scan (every ``old_formats_recheck_s``) finds one: a worker of the old version still
        running beside this one. A scan that found none is shared (``OLD_FORMATS_ABSENT_KEY``, for
        the recheck period): a restarted worker does not walk the keyspace again. Missing such a
        mark is never a lost duplicate check: the branch's event log catches the copy at commit
        time (docs/architecture.md, "Dedupe state").
        """
        if not (self.read_per_event or self.read_legacy) or self.old_formats_recheck_s <= 0:
            return  # 0: no scan, read them always
        if self._old_scan is not None and not self._old_scan.done():
            return
        if self._old_checked_at is not None and now - self._old_checked_at < self.old_formats_recheck_s:
            return
        self._old_checked_at = now
        self._old_scan = asyncio.get_running_loop().create_task(self._scan_old_formats())

    async def _scan_old_formats(self) -> None:
        try:
            if await self._redis.get(OLD_FORMATS_ABSENT_KEY):
                found = False
            else:
                found = await old_format_marks_exist(self._redis, pause_s=SCAN_PAUSE_S)
                if not found:
                    await self._redis.set(OLD_FORMATS_ABSENT_KEY, b"1", ex=max(1, int(self.old_formats_recheck_s)))
        except Exception as exc:  # noqa: BLE001 - keep reading them; asked again after the recheck period
            log.warning("could not scan Redis for old-format marks (still reading them): %s", exc)
            return
        if found != self.old_formats_seen:
            log.info("old-format applied marks %s in Redis", "found" if found else "no longer")
        self.old_formats_seen = found

    async def mark(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Mark pairs applied for the window; idempotent. Returns how many (unique pairs) were given."""
        groups = by_world(pairs)
        if not groups:
            return 0
        slot = self.window.slot(self.clock())
        calls = []
        for world, ids in groups:
            grouped = self._grouped(world, ids, slot)
            args: list[Any] = [self.window.expire_at(slot)]
            for kind, datas in grouped.values():
                args += [kind, _blob(kind, datas)]
            calls.append((list(grouped), args))
        return sum(await self._scripts(WINDOW_MARK_LUA, calls))

    async def forget(self, pairs: Iterable[tuple[str, str]]) -> int:
        """Remove marks (every live slot and the per-event formats): an operator's repair, and tests
        that simulate a lost mark. Returns how many marks were removed."""
        groups = by_world(pairs)
        if not groups:
            return 0
        calls = []
        for world, ids in groups:
            for slot in self.window.live_slots(self.clock()):
                grouped = self._grouped(world, ids, slot)
                calls.append((list(grouped), self._per_key_args(grouped)))
        removed = sum(await self._scripts(WINDOW_FORGET_LUA, calls))
        old = [k for world, ids in groups for i in ids for k in (mark_key(world, i), legacy_applied_key(world, i))]
        for i in range(0, len(old), CHUNK):
            removed += int(await self._redis.unlink(*old[i : i + CHUNK]))
        return removed

    def keys_of(self, world: str, now: float | None = None) -> list[str]:
        """Every bucket key a world's marks may use in the live slots (for the memory benchmark's
        accounting and clean-up; the hot path never lists keys)."""
        slots = self.window.live_slots(self.clock() if now is None else now)
        return [
            self.window.key(world, slot, family, b)
            for slot in slots
            for family in FAMILIES
            for b in range(self.window.buckets)
        ]

    async def _scripts(self, script: str, calls: Sequence[tuple[list[str], list[Any]]]) -> list[Any]:
        return await run_scripts(self._redis, script, calls)

    async def ping(self) -> bool:
        return bool(await self._redis.ping())

    async def close(self) -> None:
        # A scan still walking the keyspace ends with the client (a short-lived command's marks).
        scan = self._old_scan
        if scan is not None and not scan.done():
            scan.cancel()
            await asyncio.gather(scan, return_exceptions=True)
        await self._redis.aclose()


class DeadLetterMarks:
    """Dead-letter decisions per origin (keys from ``agents.letter_marks``), with the dedupe TTL.

    Same shape as the applied marks: one script call per hash tag (one slot), all of a batch's
    calls in one pipelined round trip.
    """

    def __init__(self, client: aioredis.Redis, ttl_s: int) -> None:
        self._redis = client
        self._ttl = ttl_s

    @classmethod
    def from_url(cls, url: str, ttl_s: int, **options: Any) -> DeadLetterMarks:
        """``options``: streams.security.redis_options (password, ACL user, TLS CA)."""
        client = aioredis.Redis.from_url(url, socket_timeout=10, socket_connect_timeout=5, **options)
        return cls(pack_once(client), ttl_s)

    async def states(self, keys: Iterable[str], worlds: Mapping[str, WorldLookup] | None = None) -> dict[str, bytes]:
        """The recorded ones of ``keys`` and of ``worlds``' keys (decoded records, built by the
        script from their parts) with their values (``CONFIRMED`` or ``pending(ms)``); one round trip."""
        groups = by_tag(keys, CHUNK)
        parts: list[tuple[WorldLookup, int]] = []
        calls: list[tuple[list[str], list[Any]]] = []
        for look in (worlds or {}).values():
            for start in range(0, len(look.ids), CHUNK):
                end = start + CHUNK
                redrives = look.redrives
                counts = b"\0".join(b"%d" % n for n in redrives[start:end]) if redrives else b""
                parts.append((look, start))
                calls.append(
                    (
                        [look.origin_prefix],
                        [
                            look.event_prefix,
                            _text_blob(look.ids[start:end]),
                            _text_blob(look.origins[start:end]),
                            counts,
                        ],
                    )
                )
        if not groups and not calls:
            return {}
        sets: list[tuple[str, Sequence[tuple[list[str], list[Any]]]]] = (
            [(STATES_LUA, [(g, []) for g in groups])] if groups else []
        )
        if calls:
            sets.append((ARRIVAL_STATES_LUA, calls))
        answers = await run_script_sets(self._redis, sets)
        out = {
            g[int(flat[i]) - 1]: flat[i + 1]
            for g, flat in zip(groups, answers[: len(groups)], strict=True)
            for i in range(0, len(flat), 2)
        }
        for (look, start), flat in zip(parts, answers[len(groups) :], strict=True):
            # Keys are built only for the decisions found: a lookup almost never finds one.
            for j in range(0, len(flat), 3):
                i = start + int(flat[j]) - 1
                key = look.origin_key(i) if flat[j + 1] == b"o" else look.event_key(i)
                out[key] = flat[j + 2]
        return out

    async def record(self, keys: Iterable[str], value: bytes = CONFIRMED) -> int:
        """Record ``keys`` as ``value`` with the TTL; idempotent. Returns how many were written."""
        groups = by_tag(keys, CHUNK)
        if not groups:
            return 0
        return sum(await run_scripts(self._redis, RECORD_LUA, [(g, [self._ttl, value]) for g in groups]))

    async def forget(self, states: Mapping[str, bytes]) -> int:
        """Delete each key of ``states`` still holding its value there; one round trip. Returns how
        many were deleted."""
        groups = by_tag(states, CHUNK)
        if not groups:
            return 0
        return sum(await run_scripts(self._redis, FORGET_LUA, [(g, [states[k] for k in g]) for g in groups]))

    async def close(self) -> None:
        await self._redis.aclose()
