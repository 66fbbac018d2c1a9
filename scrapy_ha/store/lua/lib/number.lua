-- lib/number: numbers written as text (ids, scores, tokens, times kept in hashes).
--
-- int_str(x)
--   Returns the number x written as an integer, without exponent or rounding.
--   Rule: scores reach 2^52 and ids and times pass 2^31; Lua's tostring keeps 14
--   significant digits and would round them, '%.0f' writes every digit of a double.
local function int_str(x)
  return str_format('%.0f', x)
end

-- DIGITS: the integers 0 .. 99 as two digits ('00' .. '99'), one constant of the script:
-- writing a number costs a call to the C library's printf (so does a Lua number passed to
-- redis.call), while cutting two characters out of a constant costs a tenth of it; the
-- frequent small numbers of a call (counts, list indices, the end of ids) are cut here.
local DIGITS = '00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899'

-- two_digits(x)
--   Returns the integer x of 0 .. 99 as two digits ('07').
local function two_digits(x)
  return str_sub(DIGITS, 2 * x + 1, 2 * x + 2)
end

-- ONE_DIGIT: the texts of 0 .. 9, at index x + 1: the numbers num_str writes most (a
-- counter's increment of 1, a list index, a token's number) read from a table, where a
-- str_sub call costs about 800 server instructions (a C call and a string interned) and
-- this table about 1,000 a call to make.
local ONE_DIGIT = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}

-- num_str(x)
--   Returns the integer x written as text (int_str), without a printf call for 0 .. 99.
local function num_str(x)
  local s = ONE_DIGIT[x + 1]
  if s then return s end
  if x >= 10 and x < 100 then return two_digits(x) end
  return int_str(x)
end

-- finite(v)
--   Returns the number the text (or number) v holds when it is finite, else nil (v nil or
--   false, not a number, or garbage Lua's tonumber reads as one: 'inf', '-inf', 'nan',
--   '1e999').
--   Rule: every time, count or score a script reads from data (not from its own
--   arguments) goes through it: an infinite time parks a queue for ever, a NaN compares
--   false with everything (a limit that holds nothing, a gate no ZADD takes), and Redis
--   refuses either in a float (HINCRBYFLOAT); they spread through every sum they enter.
local function finite(v)
  local x = v and tonumber(v)
  if x and x - x == 0 then return x end -- inf - inf and NaN - NaN are NaN
  return nil
end
