#compdef torchkit

_torchkit_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _TORCHKIT_COMPLETE=complete_zsh torchkit)
}

if [[ $zsh_eval_context[-1] == loadautofunc ]]; then
  _torchkit_completion "$@"
else
  compdef _torchkit_completion torchkit
fi
