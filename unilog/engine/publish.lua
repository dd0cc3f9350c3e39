-- The idempotent publish, sent by unilog/engine/publish.py (Publishing.publish; loaded there as package data).
-- KEYS[1]: the stream; KEYS[2]: the high-water marks beside it. ARGV: producer, epoch, first seq, '1' to skip what
-- the mark says is already there ('0': append all; '2': the same as '1' for a batch that follows one sent before it
-- in the same pipeline, refused unless that one's positions are there: Redis runs a pipeline's later calls after a
-- refused one, and this one appended past the gap would have the refused one's records skipped as present when sent
-- again), the fields per entry (the stride: 5; 7 with traceparent and tracestate; 8 with those and the record's type,
-- each maybe empty), then each entry's fields.
-- Reply: {appended, skipped, gap (the mark when below first seq - 1, else -1), first id, last id}.
local producer, epoch, first, stride = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[5])
local n = (#ARGV - 5) / stride
local skip, gap, follows, known = 0, -1, ARGV[4] == '2', false
if (ARGV[4] == '1' or follows) and redis.call('EXISTS', KEYS[1]) == 1 then
  local mark = redis.call('HGET', KEYS[2], producer)
  if mark then
    local sep = string.find(mark, ':', 1, true)
    local me, ms = tonumber(string.sub(mark, 1, sep - 1)), tonumber(string.sub(mark, sep + 1))
    if me > epoch then
      return redis.error_reply('UNILOG_STALE_EPOCH producer ' .. producer .. ' is at epoch ' .. me .. ', not ' .. epoch)
    elseif me == epoch then
      known = true
      skip = ms - first + 1
      if skip < 0 then gap = ms; skip = 0 end
      if skip > n then skip = n end
    end
  end
end
if follows and (gap >= 0 or not known) then
  return redis.error_reply('UNILOG_NOT_FOLLOWING positions of ' .. KEYS[1] .. ' before ' .. first .. ' are missing: the '
                           .. 'batch before it in the pipeline was refused, or the stream was removed meanwhile')
end
local first_id, last_id = false, false
for i = skip, n - 1 do
  local b = 5 + i * stride
  if stride >= 7 then
    local key, tp, ts = ARGV[b + 5], ARGV[b + 6], ARGV[b + 7]
    local ty = stride == 8 and ARGV[b + 8] or ''
    if key == '' and ts == '' and ty == '' and tp ~= '' then
      last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                           'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                           'traceparent', tp)
    elseif ts == '' and ty == '' and tp ~= '' then
      last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                           'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                           'key', key, 'traceparent', tp)
    elseif ts == '' and tp == '' and ty ~= '' and key ~= '' then  -- a typed record with a key, untraced
      last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                           'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                           'key', key, 'type', ty)
    else  -- the rare ones (a tracestate, a record without a traceparent in a traced batch...): fields in a table
      local f = {'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3], 'producer', producer,
                 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4]}
      if key ~= '' then f[#f + 1] = 'key'; f[#f + 1] = key end
      if ty ~= '' then f[#f + 1] = 'type'; f[#f + 1] = ty end
      if tp ~= '' then f[#f + 1] = 'traceparent'; f[#f + 1] = tp end
      if ts ~= '' then f[#f + 1] = 'tracestate'; f[#f + 1] = ts end
      last_id = redis.call('XADD', KEYS[1], '*', unpack(f))
    end
  elseif ARGV[b + 5] == '' then
    last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                         'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4])
  else
    last_id = redis.call('XADD', KEYS[1], '*', 'data', ARGV[b + 1], 'action', ARGV[b + 2], 'object', ARGV[b + 3],
                         'producer', producer, 'epoch', ARGV[2], 'seq', first + i, 'created', ARGV[b + 4],
                         'key', ARGV[b + 5])
  end
  if not first_id then first_id = last_id end
end
if n > skip then
  redis.call('HSET', KEYS[2], producer, ARGV[2] .. ':' .. tostring(first + n - 1))
end
return {n - skip, skip, gap, first_id, last_id}
