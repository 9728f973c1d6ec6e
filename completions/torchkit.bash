_torchkit_completion() {
    local IFS=$'
'
    local words=() cword=0 rest=$COMP_LINE word blanks breaks i
    for ((i = 0; i < ${#COMP_WORDS[@]}; i++)); do
        word=${COMP_WORDS[i]}
        blanks=${rest%%[![:blank:]]*}
        rest=${rest#"$blanks"}
        rest=${rest#"$word"}
        if ((i > 1)) && [[ -z $blanks && $word == =* && ${COMP_WORDS[i-1]} == --?* ]] &&
            [[ ${words[${#words[@]}-1]} == "${COMP_WORDS[i-1]}" ]]
        then
            words+=("${word#=}")
        elif ((i > 1)) && [[ -z $blanks && ( $word =~ ^[=:]+$ || ${COMP_WORDS[i-1]} =~ ^[=:]+$ ) ]]
        then
            words[${#words[@]}-1]+=$word
        else
            words+=("$word")
        fi
        ((i == COMP_CWORD)) && cword=$((${#words[@]} - 1))
    done
    for i in "${!words[@]}"; do
        [[ -z ${words[i]} ]] && ((i != cword)) && words[i]="''"
    done
    COMPREPLY=( $( env COMP_WORDS="${words[*]}" \
                   COMP_CWORD=$cword \
                   _TORCHKIT_COMPLETE=complete_bash $1 ) )
    for i in "${!COMPREPLY[@]}"; do
        if [[ -e ${COMPREPLY[i]} ]] && compopt -o filenames 2>/dev/null; then
            for i in "${!COMPREPLY[@]}"; do
                [[ -d ${COMPREPLY[i]} ]] && COMPREPLY[i]=${COMPREPLY[i]%/}
            done
            break
        fi
    done
    breaks=${COMP_WORDBREAKS//[!:=]}
    word=${words[cword]}
    [[ $breaks ]] && word=${word%"${word##*[$breaks]}"} || word=
    if [[ $word ]]; then
        for i in "${!COMPREPLY[@]}"; do
            COMPREPLY[i]=${COMPREPLY[i]#"$word"}
        done
        if ((${#COMPREPLY[@]} == 1)) && [[ -d $word${COMPREPLY[0]} ]]; then
            COMPREPLY[0]+=/
            compopt -o nospace 2>/dev/null
        fi
    fi
    return 0
}

complete -o default -F _torchkit_completion torchkit
