"""The trace viewer (`harnessrl ui`): a JSON API and a static page over trace stores."""
