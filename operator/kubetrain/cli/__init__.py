"""The `kubetrain` commands (commands.py) and what only they use: `kubetrain run` on one machine, `logs`,
`watch`, free local ports. The top floor: nothing below imports it."""
