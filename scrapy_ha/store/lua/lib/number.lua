-- lib/number: numbers written as text (ids, scores, tokens, times kept in hashes).
--
-- int_str(x)
--   Returns the number x written as an integer, without exponent or rounding.
--   Rule: scores reach 2^52 and ids and times pass 2^31; Lua's tostring keeps 14
--   significant digits and would round them, '%.0f' writes every digit of a double.
local function int_str(x)
  return string.format('%.0f', x)
end
