# The official `openai` Python client against a running `tensorfold serve` (see docs/api.md).
"""Checks a running `tensorfold serve` with the official `openai` Python client: completions and chat, streamed
and not, usage, finish reasons, logprobs, `models.retrieve`, `echo`, `best_of`, tool calls (tool_choice required,
streamed tool-call fragments joined by the client's `chat.completions.stream`, n = 2) and the errors a bad request
raises. Prints `N passed, M failed` and exits non-zero on any failure.

    python3 tools/api-tests/openai_client.py --base-url http://127.0.0.1:8080/v1 [--api-key KEY] [--model NAME]
"""

import argparse
import json
import sys
import traceback

try:
    import openai
except ImportError:
    sys.exit("the openai package is missing: pip install -r tools/api-tests/requirements.txt")

FINISH = {"stop", "length"}


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def streamed_completion(client, model, **kw):
    """Streams a completion; returns (text, finish_reason, usage, chunks)."""
    text, finish, usage, chunks = "", None, None, 0
    for chunk in client.completions.create(model=model, stream=True, stream_options={"include_usage": True}, **kw):
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.text
            finish = c.finish_reason or finish
    return text, finish, usage, chunks


def streamed_chat(client, model, **kw):
    """Streams a chat reply; returns (text, finish_reason, usage, chunks, logprob entries)."""
    text, finish, usage, chunks, lps = "", None, None, 0, []
    for chunk in client.chat.completions.create(
        model=model, stream=True, stream_options={"include_usage": True}, **kw
    ):
        chunks += 1
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
            if c.logprobs is not None and c.logprobs.content:
                lps.extend(c.logprobs.content)
    return text, finish, usage, chunks, lps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", required=True, help="the server's /v1 URL")
    ap.add_argument("--api-key", default="none", help="bearer key (any value when the server has none)")
    ap.add_argument("--model", default=None, help="model name (default: the first /v1/models entry)")
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
    state = {}
    print(f"openai {openai.__version__} against {args.base_url}")

    def t_models():
        ids = [m.id for m in client.models.list().data]
        check(ids, "no model listed")
        state["model"] = args.model or ids[0]
        check(state["model"] in ids, f"{state['model']} not in {ids}")

    def t_model_retrieve():
        m = client.models.retrieve(state["model"])
        check(m.id == state["model"] and m.object == "model", m)
        check(m.owned_by == "tensorfold", m)
        try:
            client.models.retrieve("no-such-model")
        except openai.NotFoundError as e:
            check(e.body["code"] == "model_not_found", e.body)
            return
        raise AssertionError("retrieving an unknown model did not raise NotFoundError")

    def t_completion():
        r = client.completions.create(
            model=state["model"], prompt="def main():", max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
        )
        c = r.choices[0]
        check(r.object == "text_completion", r.object)
        check(isinstance(c.text, str) and c.text, f"empty text {c.text!r}")
        check(c.finish_reason == "length", c.finish_reason)
        check(r.usage.completion_tokens == 16, r.usage)
        check(r.usage.total_tokens == r.usage.prompt_tokens + 16, r.usage)
        state["completion"] = c.text

    def t_completion_stream():
        text, finish, usage, chunks = streamed_completion(
            client, state["model"], prompt="def main():", max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
        )
        check(text == state["completion"], f"streamed {text!r} != plain {state['completion']!r}")
        check(finish == "length", finish)
        check(usage is not None and usage.completion_tokens == 16, usage)
        check(chunks > 2, f"{chunks} chunks")

    def t_completion_logprobs():
        r = client.completions.create(model=state["model"], prompt="Hello", max_tokens=5, temperature=0, logprobs=2)
        lp = r.choices[0].logprobs
        n = r.usage.completion_tokens
        check(len(lp.tokens) == n and len(lp.token_logprobs) == n and len(lp.top_logprobs) == n, lp)
        check(all(x <= 0 for x in lp.token_logprobs), lp.token_logprobs)
        check(r.choices[0].finish_reason in FINISH, r.choices[0].finish_reason)

    def t_completion_echo():
        r = client.completions.create(
            model=state["model"], prompt="def main():", max_tokens=16, temperature=0, echo=True,
            extra_body={"ignore_eos": True},
        )
        check(r.choices[0].text == "def main():" + state["completion"], r.choices[0].text)

    def t_completion_best_of():
        r = client.completions.create(
            model=state["model"], prompt="def main():", max_tokens=8, temperature=1.0, seed=5, n=2, best_of=3
        )
        check([c.index for c in r.choices] == [0, 1], r.choices)
        check(all(c.logprobs is None for c in r.choices), r.choices)
        try:
            client.completions.create(model=state["model"], prompt="x", max_tokens=2, best_of=2, stream=True)
        except openai.BadRequestError as e:
            check(e.body["param"] == "best_of", e.body)
            return
        raise AssertionError("a streamed best_of above n did not raise BadRequestError")

    def t_chat():
        r = client.chat.completions.create(
            model=state["model"],
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
            max_tokens=12,
            temperature=0,
        )
        c = r.choices[0]
        check(r.object == "chat.completion", r.object)
        check(c.message.role == "assistant", c.message.role)
        check(isinstance(c.message.content, str), c.message)
        check(c.finish_reason in FINISH, c.finish_reason)
        check(0 < r.usage.completion_tokens <= 12, r.usage)
        check(r.usage.prompt_tokens > 0, r.usage)
        state["chat"] = (c.message.content, c.finish_reason, r.usage.completion_tokens)

    def t_chat_stream():
        text, finish, usage, chunks, _ = streamed_chat(
            client,
            state["model"],
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello."}],
            max_tokens=12,
            temperature=0,
        )
        want_text, want_finish, want_tokens = state["chat"]
        check(text == want_text, f"streamed {text!r} != plain {want_text!r}")
        check(finish == want_finish, f"{finish} != {want_finish}")
        check(usage is not None and usage.completion_tokens == want_tokens, usage)
        check(chunks >= 2, f"{chunks} chunks")

    def t_chat_seeded_logprobs():
        kw = dict(
            model=state["model"],
            messages=[{"role": "user", "content": "Pick a number."}],
            max_tokens=10,
            temperature=0.8,
            seed=7,
            logprobs=True,
            top_logprobs=2,
            extra_body={"top_k": 40, "min_p": 0.05, "ignore_eos": True},
        )
        r = client.chat.completions.create(**kw)
        plain = [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in r.choices[0].logprobs.content]
        check(len(plain) == 10, plain)
        check(all(len(top) == 2 for _, _, top in plain), plain)
        text, finish, _, _, lps = streamed_chat(client, **kw)
        streamed = [(e.token, e.logprob, [(t.token, t.logprob) for t in e.top_logprobs]) for e in lps]
        check(text == r.choices[0].message.content, f"{text!r} != {r.choices[0].message.content!r}")
        check(streamed == plain, "streamed logprobs differ from plain")
        check(finish == "length", finish)

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }

    def check_call(call):
        check(call.type == "function" and call.id.startswith("call_"), call)
        check(call.function.name == "get_weather", call.function)
        args = json.loads(call.function.arguments)
        check(set(args) == {"city"} and args["city"] in ("Paris", "Oslo"), args)

    def t_tool_required():
        r = client.chat.completions.create(
            model=state["model"],
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[weather],
            tool_choice="required",
            # The default pair is a code model: allowed more than one call, it repeats the call until the length
            # runs out, so one call is asked for.
            parallel_tool_calls=False,
            max_tokens=40,
            temperature=0,
        )
        c = r.choices[0]
        check(c.finish_reason == "tool_calls", c.finish_reason)
        check(c.message.tool_calls, c.message)
        for call in c.message.tool_calls:
            check_call(call)
        # The history round trip: the call and its result sent back, answered (any text).
        r2 = client.chat.completions.create(
            model=state["model"],
            messages=[
                {"role": "user", "content": "Weather in Paris?"},
                c.message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": c.message.tool_calls[0].id, "content": "22C, sunny"},
            ],
            tools=[weather],
            max_tokens=4,
        )
        check(r2.choices[0].message.content is not None, r2.choices[0].message)

    def t_tool_stream():
        # The client's own stream accumulation (`chat.completions.stream`): the call's name first, then its
        # arguments as fragments, joined into the same call the whole reply gives.
        kw = dict(
            model=state["model"],
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[weather],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
            max_tokens=40,
            temperature=0,
        )
        whole = client.chat.completions.create(**kw).choices[0].message.tool_calls
        fragments, done, raw = [], [], []
        with client.chat.completions.stream(**kw) as stream:
            for event in stream:
                if event.type == "chunk":
                    raw.extend(d for c in event.chunk.choices for d in c.delta.tool_calls or [])
                elif event.type == "tool_calls.function.arguments.delta":
                    fragments.append(event.arguments_delta)
                    check(event.name == "get_weather" and event.index == 0, event)
                elif event.type == "tool_calls.function.arguments.done":
                    done.append(event.arguments)
            final = stream.get_final_completion()
        c = final.choices[0]
        check(c.finish_reason == "tool_calls", c.finish_reason)
        check(len(c.message.tool_calls) == 1, c.message)
        check_call(c.message.tool_calls[0])
        check(c.message.tool_calls[0].function.arguments == whole[0].function.arguments, (c.message, whole))
        check(len(fragments) > 1 and "".join(fragments) == done[0] == whole[0].function.arguments, fragments)
        check(raw[0].id and raw[0].function.name == "get_weather", raw[0])
        check(all(d.id is None and d.function.name is None for d in raw[1:]), raw)

    def t_tool_n_choices():
        # n=2 with a forced call: each choice its own call, streamed and joined per choice by the client.
        kw = dict(
            model=state["model"],
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=[weather],
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=40,
            temperature=0.9,
            seed=3,
            n=2,
        )
        whole = client.chat.completions.create(**kw)
        with client.chat.completions.stream(**kw) as stream:
            final = stream.get_final_completion()
        check([c.index for c in final.choices] == [0, 1], final.choices)
        for w, c in zip(whole.choices, final.choices):
            check(c.finish_reason == w.finish_reason == "tool_calls", (c.finish_reason, w.finish_reason))
            check(len(c.message.tool_calls) == 1, c.message)
            check_call(c.message.tool_calls[0])
            check(c.message.tool_calls[0].function.arguments == w.message.tool_calls[0].function.arguments, (c, w))

    def t_tool_bad_choice():
        try:
            client.chat.completions.create(
                model=state["model"],
                messages=[{"role": "user", "content": "Hi"}],
                tools=[weather],
                tool_choice={"type": "function", "function": {"name": "nope"}},
            )
        except openai.BadRequestError as e:
            check(e.body["param"] == "tool_choice", e.body)
            return
        raise AssertionError("an unknown tool_choice name did not raise BadRequestError")

    def t_bad_request():
        try:
            client.completions.create(model=state["model"], prompt="Hello", max_tokens=4, temperature=3)
        except openai.BadRequestError as e:
            check(e.status_code == 400, e.status_code)
            check(e.body["type"] == "invalid_request_error" and e.body["param"] == "temperature", e.body)
            return
        raise AssertionError("temperature=3 did not raise BadRequestError")

    def t_context_exceeded():
        try:
            client.chat.completions.create(
                model=state["model"], messages=[{"role": "user", "content": "Hi"}], max_tokens=10**9
            )
        except openai.BadRequestError as e:
            check(e.body["code"] == "context_length_exceeded", e.body)
            return
        raise AssertionError("max_tokens past the context did not raise BadRequestError")

    def t_unknown_model():
        try:
            client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "Hi"}])
        except openai.NotFoundError as e:
            check(e.body["code"] == "model_not_found", e.body)
            return
        raise AssertionError("an unknown model did not raise NotFoundError")

    tests = [
        t_models,
        t_model_retrieve,
        t_completion,
        t_completion_echo,
        t_completion_stream,
        t_completion_logprobs,
        t_completion_best_of,
        t_chat,
        t_chat_stream,
        t_chat_seeded_logprobs,
        t_tool_required,
        t_tool_stream,
        t_tool_n_choices,
        t_tool_bad_choice,
        t_bad_request,
        t_context_exceeded,
        t_unknown_model,
    ]
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
