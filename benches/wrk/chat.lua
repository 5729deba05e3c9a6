-- wrk script: POST a small non-stream chat completion (model from env WRK_MODEL, default gpt-4o-mini)
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local model = os.getenv("WRK_MODEL") or "gpt-4o-mini"
wrk.body = '{"model":"' .. model .. '","messages":[{"role":"user","content":"Say hello in one short sentence please."}],"max_tokens":16}'
-- a gateway key (env WRK_KEY), sent the way the OpenAI SDK sends it
local key = os.getenv("WRK_KEY")
if key and key ~= "" then
  wrk.headers["Authorization"] = "Bearer " .. key
end
