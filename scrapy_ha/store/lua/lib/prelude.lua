-- lib/prelude: the functions the scripts call most, read once into locals at the start of
-- every script (scripts.py puts this file first, after the script's header). A global such
-- as string.match costs two table lookups on every call (the global table, then the
-- library's): read once, a call costs none (about 1% of the sync script's work, counted
-- with callgrind).
local redis_call, redis_pcall = redis.call, redis.pcall
local str_byte, str_find, str_format, str_gmatch = string.byte, string.find, string.format,
  string.gmatch
local str_match, str_sub = string.match, string.sub
local math_ceil, math_floor, math_max, math_min = math.ceil, math.floor, math.max, math.min
local ipairs, next, pairs, select, tonumber, type, unpack = ipairs, next, pairs, select,
  tonumber, type, unpack
