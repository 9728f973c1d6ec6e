#compdef torchkit

_torchkit_completion() {
  eval $(env _TYPER_COMPLETE_ARGS="${words[1,$CURRENT]}" _TORCHKIT_COMPLETE=complete_zsh torchkit)
}

compdef _torchkit_completion torchkit
