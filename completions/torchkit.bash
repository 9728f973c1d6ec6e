_torchkit_completion() {
    local IFS=$'
'
    COMPREPLY=( $( env COMP_WORDS="${COMP_WORDS[*]}" \
                   COMP_CWORD=$COMP_CWORD \
                   _TORCHKIT_COMPLETE=complete_bash $1 ) )
    local i
    for i in "${!COMPREPLY[@]}"; do
        if [[ -e ${COMPREPLY[i]} ]] && compopt -o filenames 2>/dev/null; then
            for i in "${!COMPREPLY[@]}"; do
                [[ -d ${COMPREPLY[i]} ]] && COMPREPLY[i]=${COMPREPLY[i]%/}
            done
            break
        fi
    done
    return 0
}

complete -o default -F _torchkit_completion torchkit
