# LangChain's `ChatOpenAI` (langchain-openai) against a running `tensorfold serve`: a tool-calling round trip.
"""Checks a running `tensorfold serve` with LangChain's `ChatOpenAI` as agent code uses it: `bind_tools` with a
forced call (`tool_choice` the function, one call), the call read into `AIMessage.tool_calls` with its arguments
parsed, the same call streamed and joined from LangChain's `tool_call_chunks`, then the round trip: the call and a
`ToolMessage` with its result sent back and answered. The default pair is a code model, so this checks the
protocol, not the model's choices. Prints `N passed, M failed` and exits non-zero on any failure.

    python3 tools/api-tests/langchain_client.py --base-url http://127.0.0.1:8080/v1 [--model NAME]
"""

import argparse
import sys
import traceback

try:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
except ImportError:
    sys.exit("langchain-openai is missing: pip install -r tools/api-tests/requirements.txt")


@tool
def get_weather(city: str) -> str:
    """Current weather of a city."""
    return f"22C and sunny in {city}"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="the server's /v1 URL")
    ap.add_argument("--model", default="tensorfold", help="the served model's name")
    args = ap.parse_args()
    llm = ChatOpenAI(
        base_url=args.base_url,
        api_key="none",
        model=args.model,
        temperature=0,
        max_tokens=40,
        max_retries=0,
        timeout=120,
        use_responses_api=False,
    )
    forced = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    question = [HumanMessage("What is the weather in Paris?")]
    state = {}

    def t_forced_call():
        msg = forced.invoke(question)
        check(isinstance(msg, AIMessage), msg)
        check(len(msg.tool_calls) == 1, msg)
        call = msg.tool_calls[0]
        check(call["name"] == "get_weather" and isinstance(call["args"].get("city"), str), call)
        check(call["id"].startswith("call_"), call)
        check(msg.response_metadata.get("finish_reason") == "tool_calls", msg.response_metadata)
        state["msg"] = msg

    def t_streamed_call():
        joined = None
        for chunk in forced.stream(question):
            joined = chunk if joined is None else joined + chunk
        check(joined is not None and len(joined.tool_call_chunks) == 1, joined)
        check(len(joined.tool_calls) == 1, joined)
        call = joined.tool_calls[0]
        # Joined by index: an id or name repeated in a later delta would have been concatenated.
        check(call["name"] == "get_weather" and len(call["id"]) == 29, call)
        check(call["args"] == state["msg"].tool_calls[0]["args"], (call, state["msg"].tool_calls))

    def t_round_trip():
        msg = state["msg"]
        result = get_weather.invoke(msg.tool_calls[0])
        check(isinstance(result, ToolMessage) and result.tool_call_id == msg.tool_calls[0]["id"], result)
        answer = llm.bind_tools([get_weather]).invoke(question + [msg, result])
        check(isinstance(answer, AIMessage) and isinstance(answer.content, str), answer)

    tests = [t_forced_call, t_streamed_call, t_round_trip]
    passed = failed = 0
    for t in tests:
        try:
            t()
            passed += 1
            print(f"ok    {t.__name__[2:]}")
        except Exception:
            failed += 1
            print(f"FAIL  {t.__name__[2:]}\n{traceback.format_exc()}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
