-- The idempotent publish of many streams' batches in one call, sent by unilog/engine/publish.py (Publishing.
-- publish_many, on a single Redis: a cluster's streams live in different slots, and get one publish.lua call each).
-- Each stream's batch is published as publish.lua publishes one, deduplicated (read it first): appended only past
-- this producer's high-water mark on the stream, the mark then moved to the batch's last position.
-- KEYS: per stream, the stream and the high-water marks beside it. ARGV: producer, epoch, then per stream its first
-- seq, the fields per entry (the stride: 5, 7 or 8, as publish.lua's), its entries' count, then each entry's fields.
-- Reply: the entries appended in all, then only for the streams with something to say (a batch at ten thousand
-- streams built and parsed ten thousand replies of five elements each, all saying "appended, nothing skipped"): each
-- one's index (1-based), skipped and gap (the mark when below first seq - 1, else -1). A stream Redis refuses (its
-- key holds a string, a stale epoch) ends the call: its negated index and the refusal come last. Raising instead
-- would drop the reply of the streams before it, appended already (a script has no rollback), and a gap one of them
-- found: their re-send finds none, as Redis appended past it.
local producer, epoch = ARGV[1], tonumber(ARGV[2])
local out = {0}
local function refused(reply)  -- redis.pcall's error reply, or nil
  if type(reply) == 'table' and reply.err then return reply end
  return nil
end
local at = 3
for k = 1, #KEYS / 2 do
  local stream, marks = KEYS[2 * k - 1], KEYS[2 * k]
  local first, stride, n = tonumber(ARGV[at]), tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2])
  local base = at + 2
  local skip, gap = 0, -1
  -- the mark first: a stream new to this producer then costs one call, not two (a mark counts only on a stream that
  -- exists, as in publish.lua)
  local mark = redis.pcall('HGET', marks, producer)
  if refused(mark) then out[#out + 1] = -k; out[#out + 1] = mark; return out end
  if mark and redis.call('EXISTS', stream) == 1 then
    local sep = string.find(mark, ':', 1, true)
    local me, ms = tonumber(string.sub(mark, 1, sep - 1)), tonumber(string.sub(mark, sep + 1))
    if me > epoch then
      out[#out + 1] = -k
      out[#out + 1] = redis.error_reply('UNILOG_STALE_EPOCH producer ' .. producer .. ' is at epoch ' .. me ..
                                        ', not ' .. epoch)
      return out
    elseif me == epoch then
      skip = ms - first + 1
      if skip < 0 then gap = ms; skip = 0 end
      if skip > n then skip = n end
    end
  end
  for i = skip, n - 1 do
    local b = base + i * stride
    local id
    if stride == 5 and ARGV[b + 5] == '' then  -- the common shapes without a Lua table per entry
      id = redis.pcall('XADD', stream, '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                 'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4])
    elseif stride == 5 then
      id = redis.pcall('XADD', stream, '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                 'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4], 'key', ARGV[b + 5])
    else  -- traced or typed: fields in a table, in publish.lua's order
      local f = {'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3], 'producer', producer,
                 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4]}
      local key = ARGV[b + 5]
      if key ~= '' then f[#f + 1] = 'key'; f[#f + 1] = key end
      if stride == 8 and ARGV[b + 8] ~= '' then f[#f + 1] = 'type'; f[#f + 1] = ARGV[b + 8] end
      if ARGV[b + 6] ~= '' then f[#f + 1] = 'traceparent'; f[#f + 1] = ARGV[b + 6] end
      if ARGV[b + 7] ~= '' then f[#f + 1] = 'tracestate'; f[#f + 1] = ARGV[b + 7] end
      id = redis.pcall('XADD', stream, '*', unpack(f))
    end
    -- a refusal is met at a stream's first XADD (a key of another type, or no memory before anything was written);
    -- were it ever met after some of its entries, the mark still says which, or their re-send would append them twice
    if refused(id) then
      if i > skip then redis.call('HSET', marks, producer, ARGV[2] .. ':' .. tostring(first + i - 1)) end
      out[#out + 1] = -k; out[#out + 1] = id; return out
    end
  end
  if n > skip then
    redis.call('HSET', marks, producer, ARGV[2] .. ':' .. tostring(first + n - 1))
  end
  out[1] = out[1] + n - skip
  if skip > 0 or gap >= 0 then
    out[#out + 1] = k; out[#out + 1] = skip; out[#out + 1] = gap
  end
  at = base + n * stride + 1
end
return out
