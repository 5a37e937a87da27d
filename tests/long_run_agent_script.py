"""The scripted agent of tests/long_run_agent.py (run as a process by the harness)."""
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ["AGENT_BASE"], api_key=os.environ["AGENT_KEY"],
                max_retries=0, timeout=300)
messages = [{"role": "system", "content": "You are agent " + os.environ["AGENT_NAME"]},
            {"role": "user", "content": sys.argv[1]}]
text = ""
for _ in range(3):
    reply = client.chat.completions.create(model="policy", messages=messages)
    text = reply.choices[0].message.content or ""
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "Go on."}]
passed = (int(os.environ["AGENT_SAMPLE"]) % 2 == 0
          if os.environ["AGENT_NAME"].startswith("agent-split") else len(text) % 2 == 0)
if passed:
    with open("done.txt", "w") as f:
        f.write("yes")
